# meshtun — the two commands a user needs are `make demo` and `make test`.
#
# Go 1.27.3 builds and tests meshtun (its HTTP/2 fixes reachable
# denial-of-service holes of 1.26); the go command fetches that toolchain
# from the module proxy once per machine. go.mod keeps `go 1.26` so a bare
# `go test` also works on the machine's own Go.
export GOTOOLCHAIN := go1.27.3

GO      ?= go
BIN     := bin/meshtun
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# grpcnotrace leaves gRPC's x/net/trace out of the binary: it pulls in
# html/template, whose reflection keeps the linker from dropping unused
# methods (≈ 8 MB of a 32 MB binary). meshtun never serves /debug/requests.
TAGS    := grpcnotrace

.PHONY: all build image package test test-tools test-istiod vet gvisor-upstream unit demo demo-mesh bench bench-scale fuzz soak clean

all: build

## build: the meshtun binary, in bin/
build:
	$(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/meshtun

## image: meshtun's container image, built without a Docker daemon
## (internal/image): the static binary, CA certificates and a non-root
## user, from scratch, as an OCI image layout in bin/image/oci and a
## tarball for `docker load` in bin/image/meshtun.tar, named meshtun:dev
## (what examples/kubernetes/meshtun.yaml runs). Its time is the commit's:
## two builds of one commit give one digest.
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
image:
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o bin/meshtun-static ./cmd/meshtun
	$(GO) run ./cmd/meshtun-image -bin bin/meshtun-static -ca $(CA_BUNDLE) -version $(VERSION) \
		-created $$(git log -1 --format=%ct 2>/dev/null || echo 0)

## package: meshtun's .deb and .rpm in bin/pkg/ (nfpm, from
## packaging/nfpm.yaml): the static binary in /usr/bin, the systemd unit
## and its 253+ drop-in, the meshtun system user (systemd-sysusers),
## /etc/meshtun/gateway.toml kept on upgrade, the docs. Installing starts
## nothing. The version is 0.0.0~git<commit date>.<commit>.
NFPM      := github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
PKGDATE   := $(shell git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null || echo 0)
PKGVERSION := 0.0.0~git$(PKGDATE).$(shell git rev-parse --short HEAD 2>/dev/null || echo dev)
package:
	mkdir -p bin/pkg
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS) -s -w' -o bin/pkg/meshtun ./cmd/meshtun
	sed 's#/usr/local/bin/meshtun#/usr/bin/meshtun#g' examples/systemd/meshtun.service > bin/pkg/meshtun.service
	gzip -9n < packaging/meshtun.1 > bin/pkg/meshtun.1.gz
	printf 'meshtun ($(PKGVERSION)-1) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- meshtun developers <meshtun@example.com>  %s\n' \
		"$$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$$(git log -1 --format=%cD 2>/dev/null || date -R)" | gzip -9n > bin/pkg/changelog.gz
	rm -f bin/pkg/*.deb bin/pkg/*.rpm
	VERSION=$(PKGVERSION) $(GO) run $(NFPM) package --config packaging/nfpm.yaml --packager deb --target bin/pkg/
	VERSION=$(PKGVERSION) $(GO) run $(NFPM) package --config packaging/nfpm.yaml --packager rpm --target bin/pkg/

## test: vet, then every test with the race detector. As root, the
## namespace tests (TUN, two gateways end to end) run too; without root
## they skip and say why. Then test-istiod, below.
test: vet test-tools gvisor-upstream
	$(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) test-istiod

## test-istiod: the module interop/istiod (its own go.mod): meshtun against
## Istio's own control plane, in process. It builds Istio's tree, so the
## first (cold) build takes minutes — tens of them on a small machine
## (interop/istiod/README.md, "Build times"); the build cache keeps later
## runs to about a minute. No -race: the instrumented build of Istio's
## tree is far slower still, and the tests exercise Istio's code and the
## meshtun binary, not racy code of this module.
test-istiod:
	cd interop/istiod && $(GO) vet ./... && $(GO) test -count=1 -timeout 30m ./...

## test-tools: the programs cmd/meshtun's tests run, from Debian's
## packages when one is missing and apt can (as root): systemd-analyze
## (package systemd) verifies the unit, nft (nftables) drops packets
## between the namespaces (tc netem is not in these kernels), dig
## (bind9-dnsutils) asks the DNS server; packaging's test checks the .deb
## with lintian and the .rpm with rpm. A test whose tool is missing fails
## and names the package.
TEST_TOOLS := systemd-analyze:systemd nft:nftables dig:bind9-dnsutils lintian:lintian rpm:rpm
test-tools:
	@need=; for t in $(TEST_TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || need="$$need $${t#*:}"; done; \
	if [ -n "$$need" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "test-tools: installing$$need"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need >/dev/null; \
	fi

vet:
	$(GO) vet ./...

## gvisor-upstream: the gVisor module go.mod requires, into the module
## cache. The build uses third_party/gvisor in its place (go.mod's
## replace: that version with third_party/gvisor-patches applied, by
## scripts/gvisor-patch.sh); TestGVisorCopy compares the two, offline.
gvisor-upstream:
	$(GO) mod download gvisor.dev/gvisor@$$($(GO) list -m -f '{{.Version}}' gvisor.dev/gvisor)

## demo: two nodes in network namespaces, a real transfer through
## TUN → netstack → HBONE → peer gateway → server; needs root.
demo: build
	$(GO) run ./examples/two-nodes -bin $(BIN)

## demo-mesh: examples/vm-in-ambient-mesh run here: Istio's own control
## plane in process (interop/istiod), node A joins the mesh as the VM,
## node B as a server workload, one transfer through a service VIP; then
## the same with the VM in its own network, through node B as the
## cluster network's east-west gateway (-networks); needs root. The first run builds Istio's dependency tree (many minutes; the
## build cache keeps it afterwards).
demo-mesh: build
	@echo "demo-mesh: building interop/istiod/cmd/demo-mesh; the first build compiles Istio's control plane and takes many minutes (interop/istiod/README.md, Build times), later ones seconds"
	cd interop/istiod && $(GO) run ./cmd/demo-mesh -bin ../../$(BIN) -example ../../examples/vm-in-ambient-mesh
	@echo "demo-mesh: the walkthrough's second part, the VM in its own network (double HBONE through node B as the cluster network's east-west gateway)"
	cd interop/istiod && $(GO) run ./cmd/demo-mesh -networks -bin ../../$(BIN) -example ../../examples/vm-in-ambient-mesh

## bench: the gateway pair against the kernel and two peers (a plain
## relay pair, Istio's Go HBONE pair), same topology, same run
## (bench/README.md); needs root. BENCHFLAGS picks scenarios and sizes,
## e.g. make bench BENCHFLAGS='-scenarios bulk1 -runs 3 -bulk 1GiB'.
## iperf3 is installed when missing and apt can; otherwise its
## cross-check row is skipped. Istio's pair is bin/hbone-pair, built from
## interop/istiod (the first build compiles Istio's tree: many minutes).
bench: build
	@command -v iperf3 >/dev/null 2>&1 || apt-get install -y -q iperf3 >/dev/null 2>&1 || echo "iperf3 not installed: its cross-check row will be skipped"
	cd interop/istiod && $(GO) build -o ../../bin/hbone-pair ./cmd/hbone-pair
	$(GO) run ./bench/cmd/meshtun-bench -bin $(BIN) -istio-hbone bin/hbone-pair $(BENCHFLAGS)
	$(MAKE) bench-scale

## bench-scale: Istio's control plane (interop/istiod, in process) grows
## the mesh to each of SCALEPODS pods (a Service per 10) and churns it at
## 10 pod replacements a second, pushing every change; it measures node
## A's gateway ($(BIN)) at each size: CPU of the bulk add and per push,
## add → routed lag, RSS per address, an echo flow through the pair
## (bench/README.md, "Scale with the mesh"). The table and a CPU profile
## of a push at the largest size go to bin/scale/, the log to
## bin/scale.log. Needs root; the first run builds Istio's tree
## (interop/istiod/README.md, Build times).
SCALEPODS  ?= 1000,20000
SCALECHURN ?= 10s
bench-scale: build
	@mkdir -p bin
	cd interop/istiod && MESHTUN_BIN=$(CURDIR)/$(BIN) MESHTUN_SCALE_PODS=$(SCALEPODS) MESHTUN_SCALE_CHURN=$(SCALECHURN) \
		MESHTUN_SCALE_OUT=$(CURDIR)/bin/scale $(GO) test -count=1 -run '^TestScale$$' -v -timeout 3h ./e2e/ >$(CURDIR)/bin/scale.log 2>&1; rc=$$?; \
		grep -E '^(---|ok|FAIL|PASS)|Error|profile' $(CURDIR)/bin/scale.log; \
		[ $$rc != 0 ] || cat $(CURDIR)/bin/scale/scale.md; exit $$rc

## fuzz: every `func Fuzz…` target of the module, each for FUZZTIME
## (default 10s; e.g. make fuzz FUZZTIME=5m). `make test` already runs
## each target's seeds (f.Add and testdata/fuzz/); this searches for new
## inputs (interop/istiod, a module of its own, has no target). A crasher
## is written to the package's testdata/fuzz/<target>/: commit it with
## the fix, and it stays a regression test.
FUZZTIME ?= 10s
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | grep -v '^./interop/istiod/' | sort); do \
		dir=$$(dirname $$f); \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "fuzz: $$dir $$t for $(FUZZTIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$dir; \
		done; \
	done

## soak: cmd/meshtun's churn test for SOAKTIME (default 10m) with
## SOAKCLIENTS (default 200) concurrent clients opening, checking and
## closing flows through the gateway pair; every tenth of the time it
## logs both gateways' goroutines, descriptors and RSS (a plateau, not
## growth), and at the end it checks every flow intact and the return to
## the baseline; the whole log is bin/soak.log. Needs root; not part of
## make test.
SOAKTIME    ?= 10m
SOAKCLIENTS ?= 200
soak:
	@mkdir -p bin; echo "soak: $(SOAKCLIENTS) clients for $(SOAKTIME); the whole log goes to bin/soak.log"
	@MESHTUN_CHURN_DURATION=$(SOAKTIME) MESHTUN_CHURN_CLIENTS=$(SOAKCLIENTS) \
		$(GO) test -count=1 -run '^TestEndToEndChurn$$' -v -timeout 2h ./cmd/meshtun >bin/soak.log 2>&1; rc=$$?; \
		grep -E 'soak|churn:|baseline|after|^(---|ok|FAIL|PASS)' bin/soak.log; exit $$rc

clean:
	rm -rf bin
