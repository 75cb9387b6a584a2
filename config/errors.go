package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Errors is every problem found in one configuration. Parse, Load and
// Validate return it (as error) when anything is wrong.
type Errors struct {
	Source string   // the file, as given to Load or Parse; may be empty
	List   []*Error // in schema order (unknown keys last in their table); a syntax error stands alone
}

// Error prints one problem per line:
//
//	<source>:<line>:<col>: <path>: <msg>   when the position is known
//	<source>: <path>: <msg>                otherwise
func (e *Errors) Error() string {
	var b strings.Builder
	for i, p := range e.List {
		if i > 0 {
			b.WriteByte('\n')
		}
		if e.Source != "" {
			b.WriteString(e.Source)
			if p.Line > 0 {
				b.WriteByte(':')
			} else {
				b.WriteString(": ")
			}
		}
		b.WriteString(p.Error())
	}
	return b.String()
}

// Error is one problem. Path is the key path ("tun.mtu",
// "peers[1].cidrs[0]"), empty for problems with the file as a whole. Line
// and Column are 1-based and known for syntax errors, 0 otherwise.
type Error struct {
	Path         string
	Line, Column int
	Msg          string
}

// Error prints "<line>:<col>: <path>: <msg>", leaving out what is unknown.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:%d: ", e.Line, e.Column)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// problems collects Errors while a Config is decoded and checked.
type problems struct {
	list []*Error
	keys keyIndex // for at and path; nil while decoding, which knows its paths
	cfg  *Config  // the Config being checked, whose state decides conditional requirements
}

func (p *problems) add(path, format string, args ...any) {
	p.list = append(p.list, &Error{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// at adds a problem with the value ptr points to, a key of the Config
// being checked or an entry of one of its lists.
func (p *problems) at(ptr any, format string, args ...any) {
	p.add(p.path(ptr), format, args...)
}

// path is the key path of the value ptr points to.
func (p *problems) path(ptr any) string {
	return p.lookup(ptr).path
}

func (p *problems) lookup(ptr any) indexed {
	x, ok := p.keys[ptr]
	if !ok {
		panic(fmt.Sprintf("config: %T is not a key of the config being checked", ptr))
	}
	return x
}

// errs returns the problems as an error, or nil when there are none.
func (p *problems) errs(source string) error {
	if len(p.list) == 0 {
		return nil
	}
	return &Errors{Source: source, List: p.list}
}

// sortByOrder orders list by the rank of each path in order (the sequence
// in which the decoder met the keys), falling back to the nearest ranked
// parent, so decoding and validation problems interleave in schema order.
func sortByOrder(list []*Error, order map[string]int) {
	rank := func(path string) int {
		for p := path; p != ""; p = parentPath(p) {
			if r, ok := order[p]; ok {
				return r
			}
		}
		return -1 // problems with the whole file come first
	}
	sort.SliceStable(list, func(i, j int) bool {
		if list[i].Line != list[j].Line {
			return list[i].Line < list[j].Line
		}
		return rank(list[i].Path) < rank(list[j].Path)
	})
}

// parentPath strips the last element of a key path: "a.b[2]" → "a.b",
// "a.b" → "a", "a" → "".
func parentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if strings.HasSuffix(p, `"`) { // a quoted key
		if i := strings.LastIndex(p[:len(p)-1], `."`); i >= 0 {
			return p[:i]
		}
		if strings.HasPrefix(p, `"`) {
			return ""
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// within reports whether path is base or lies below it.
func within(path, base string) bool {
	if !strings.HasPrefix(path, base) {
		return false
	}
	rest := path[len(base):]
	return rest == "" || rest[0] == '.' || rest[0] == '['
}

// joinPath adds key to the key path parent, quoting key when TOML would.
func joinPath(parent, key string) string {
	if !isBareKey(key) {
		key = strconv.Quote(key)
	}
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

func isBareKey(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// closest returns the entry of known nearest to key, if it is near enough
// to be a likely typo: case and '-' for '_' are ignored, and the edit
// distance may be 1 for short keys and up to 3 for long ones.
func closest(key string, known []string) (string, bool) {
	norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "-", "_") }
	if len(key) > 64 { // no one mistypes a key that long; keep the work bounded
		return "", false
	}
	k := norm(key)
	best, bestDist := "", -1
	for _, c := range known {
		d := editDistance(k, norm(c))
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	limit := 1
	switch n := len(k); {
	case n > 8:
		limit = 3
	case n > 4:
		limit = 2
	}
	if bestDist < 0 || bestDist > limit {
		return "", false
	}
	return best, true
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
