#!/usr/bin/env bash
# gvisor-patch.sh [-o DIR] [VERSION]
#
# Rebuilds third_party/gvisor, the copy of gVisor the build uses in place
# of the upstream module (go.mod's replace): gVisor at VERSION (default:
# the version go.mod requires), only the packages meshtun's modules
# import, directly or through gVisor, under any build constraint, with
# every patch of third_party/gvisor-patches applied in order.
#
# To move to a newer gVisor:
#     go get gvisor.dev/gvisor@NEW      (also in interop/istiod)
#     scripts/gvisor-patch.sh
# A patch that no longer applies stops the script; mend the patch, not the
# copy. TestGVisorCopy (third_party_test.go) fails while the copy is not
# what this script makes of the required version.
#
# -o DIR writes the copy to DIR instead (the test's use).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/third_party/gvisor
if [ "${1:-}" = -o ]; then
	out=$2
	shift 2
fi
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
module=gvisor.dev/gvisor
ver=${1:-$(cd "$root" && go list -m -f '{{.Version}}' "$module")}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

src=$(cd "$root" && GOFLAGS=-mod=mod go mod download -json "$module@$ver" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
if [ ! -d "$src" ]; then
	echo "gvisor-patch: $module@$ver is not in the module cache and could not be downloaded" >&2
	exit 1
fi

# The packages the two modules import, and theirs, under any build
# constraint: what go mod tidy checks.
go run "$root/scripts/gvisor-imports.go" "$src" "$root" >"$tmp/packages"

rm -rf "$out"
mkdir -p "$out"
install -m 0644 "$src/go.mod" "$src/LICENSE" "$out/"
while read -r pkg; do
	dir=${pkg#"$module"/}
	mkdir -p "$out/$dir"
	# A package is its directory's files, not its subdirectories'.
	find "$src/$dir" -maxdepth 1 -type f \( -name '*.go' ! -name '*_test.go' -o -name '*.s' -o -name '*.h' \) \
		-exec install -m 0644 {} "$out/$dir/" \;
done <"$tmp/packages"

for p in "$root"/third_party/gvisor-patches/*.patch; do
	if ! patch --quiet --no-backup-if-mismatch -d "$out" -p1 <"$p"; then
		echo "gvisor-patch: $(basename "$p") does not apply to $module@$ver" >&2
		exit 1
	fi
done
echo "gvisor-patch: $module@$ver, $(wc -l <"$tmp/packages") packages, into $out"
