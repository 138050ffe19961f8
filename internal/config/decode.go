package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decodeBudget bounds the nodes visited while decoding. Aliases are not
// copied in a yaml.Node tree, so a small file can reference one anchor
// exponentially often ("billion laughs"); real configs visit a few hundred.
const decodeBudget = 200_000

// nodeDecoder is implemented by types with a YAML shape of their own
// (Duration, Subjects). Problem paths are relative to the value ("" for the
// value itself, "[2]" for an element).
type nodeDecoder interface {
	decodeNode(n *yaml.Node) []Problem
}

// decoder walks a yaml.Node tree into a Go value, reporting every unknown
// key and type error with its path instead of stopping at the first one as
// yaml.Decoder does.
type decoder struct {
	ps        *problemSet
	budget    int
	exhausted bool
	merging   map[*yaml.Node]bool
}

// decodeYAML parses text and decodes its single document into c.
func decodeYAML(text string, c *Config, ps *problemSet) {
	root, err := parseYAML(text)
	if err != nil {
		ps.add("", yamlErrorLine(err), "%s", yamlErrorMessage(err))
		return
	}
	if root == nil {
		return // empty file: all defaults
	}
	d := &decoder{ps: ps, budget: decodeBudget, merging: map[*yaml.Node]bool{}}
	d.decode(root, reflect.ValueOf(c).Elem(), "")
}

// parseYAML returns the root node of the only document in text, nil for an
// empty document. yaml.v3 has had panics on hostile input; one must fail
// the config, not the process.
func parseYAML(text string) (root *yaml.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			root, err = nil, fmt.Errorf("yaml: cannot parse: %v", r)
		}
	}()
	dec := yaml.NewDecoder(strings.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, err
	default:
		return nil, fmt.Errorf("yaml: line %d: a second document (---) is not supported; put everything in one", extra.Line)
	}
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil, nil
		}
		return doc.Content[0], nil
	}
	return &doc, nil
}

// yamlErrorLine extracts "line N" from a yaml error message.
func yamlErrorLine(err error) int {
	var line int
	msg := err.Error()
	if i := strings.Index(msg, "line "); i >= 0 {
		_, _ = fmt.Sscanf(msg[i:], "line %d", &line)
	}
	return line
}

// yamlErrorMessage flattens a yaml error onto one line.
func yamlErrorMessage(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if !strings.HasPrefix(msg, "yaml:") {
		msg = "yaml: " + msg
	}
	return msg
}

// resolve follows an alias and spends budget; nil once it is exhausted.
func (d *decoder) resolve(n *yaml.Node) *yaml.Node {
	if d.exhausted {
		return nil
	}
	d.budget--
	if d.budget < 0 {
		d.exhausted = true
		d.ps.add("", n.Line, "yaml: too many nodes or alias expansions (more than %d); the config is not decoded further", decodeBudget)
		return nil
	}
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 16; i++ {
		n = n.Alias
	}
	if n == nil || n.Kind == yaml.AliasNode {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
	}
	return n
}

// isNull reports whether n is an explicit or implicit null ("key:", "~").
func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names a node for a type error: "a list", `string "ten"`.
func describe(n *yaml.Node) string {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := truncate(n.Value, 40)
		switch n.ShortTag() {
		case "!!str":
			return fmt.Sprintf("string %q", v)
		case "!!int":
			return "integer " + v
		case "!!float":
			return "number " + v
		case "!!bool":
			return "boolean " + v
		case "!!null":
			return "null"
		default:
			return fmt.Sprintf("%s %q", n.ShortTag(), v)
		}
	}
	return "nothing"
}

// decode stores n into v (addressable), recording problems under path.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	line := n.Line
	n = d.resolve(n)
	if n == nil {
		return
	}
	if _, seen := d.ps.lines[path]; !seen && path != "" {
		d.ps.lines[path] = line
	}
	if isNull(n) {
		return // unset: the default applies
	}
	d.ps.set[path] = true

	if nd, ok := v.Addr().Interface().(nodeDecoder); ok {
		for _, p := range nd.decodeNode(n) {
			l := p.Line
			if l == 0 {
				l = line
			}
			d.ps.decodeErr(path+p.Path, l, "%s", p.Message)
		}
		return
	}

	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Map:
		d.decodeMap(n, v, path)
	case reflect.Slice:
		d.decodeSlice(n, v, path)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.ps.decodeErr(path, line, "expected a string, got %s", describe(n))
			return
		}
		// Any scalar is text here: "token: 12345" means the string.
		v.SetString(n.Value)
	case reflect.Int, reflect.Int64:
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && strings.Trim(n.Value, "+-0123456789") == "" {
			// yaml.v3 resolves integers too large for int64 as floats.
			d.ps.decodeErr(path, line, "integer %s out of range", truncate(n.Value, 40))
			return
		}
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			d.ps.decodeErr(path, line, "expected an integer, got %s", describe(n))
			return
		}
		var i int64
		if err := n.Decode(&i); err != nil || v.OverflowInt(i) {
			d.ps.decodeErr(path, line, "integer %s out of range", truncate(n.Value, 40))
			return
		}
		v.SetInt(i)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			d.ps.decodeErr(path, line, "expected true or false, got %s", describe(n))
			return
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			d.ps.decodeErr(path, line, "expected true or false, got %s", describe(n))
			return
		}
		v.SetBool(b)
	default:
		// Only reachable if a field of an unsupported kind is added.
		d.ps.decodeErr(path, line, "internal error: cannot decode into %s", v.Type())
	}
}

// fieldInfo maps YAML keys to struct fields.
type fieldInfo struct {
	index map[string]int
	names []string // in declaration order, for suggestions
}

func structFields(t reflect.Type) fieldInfo {
	fi := fieldInfo{index: map[string]int{}}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		fi.index[name] = i
		fi.names = append(fi.names, name)
	}
	return fi
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.ps.decodeErr(path, n.Line, "expected a mapping, got %s", describe(n))
		return
	}
	fi := structFields(v.Type())
	for _, kv := range d.pairs(n, path) {
		name := kv.key.Value
		p := keyPath(path, name)
		i, ok := fi.index[name]
		if !ok {
			if _, seen := d.ps.lines[p]; !seen {
				d.ps.lines[p] = kv.key.Line
			}
			d.ps.add(p, kv.key.Line, "%s", unknownKey(name, fi.names))
			continue
		}
		d.decode(kv.val, v.Field(i), p)
	}
}

func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.ps.decodeErr(path, n.Line, "expected a mapping, got %s", describe(n))
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	for _, kv := range d.pairs(n, path) {
		name := kv.key.Value
		p := keyPath(path, name)
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(kv.val, elem, p)
		v.SetMapIndex(reflect.ValueOf(name).Convert(v.Type().Key()), elem)
	}
}

func (d *decoder) decodeSlice(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		hint := ""
		if v.Type().Elem().Kind() == reflect.String && n.Kind == yaml.ScalarNode {
			hint = fmt.Sprintf(` (write a list, e.g. [%q])`, truncate(n.Value, 40))
		}
		d.ps.decodeErr(path, n.Line, "expected a list, got %s%s", describe(n), hint)
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, e := range n.Content {
		p := indexPath(path, i)
		r := e
		if r.Kind == yaml.AliasNode && r.Alias != nil {
			r = r.Alias
		}
		if isNull(r) {
			// A null element is a mistake ("- " with nothing), not a
			// default.
			d.ps.lines[p] = e.Line
			d.ps.decodeErr(p, e.Line, "expected a value, got null")
			continue
		}
		d.decode(e, s.Index(i), p)
	}
	v.Set(s)
}

// pair is one key and value of a mapping.
type pair struct{ key, val *yaml.Node }

// pairs returns the entries of mapping n with merge keys ("<<: *base")
// applied, explicit keys winning. Duplicate explicit keys are problems:
// yaml.v3 only catches them when decoding into a Go map.
func (d *decoder) pairs(n *yaml.Node, path string) []pair {
	var out []pair
	var merges []*yaml.Node
	first := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := d.resolve(n.Content[i])
		if k == nil {
			return out
		}
		val := n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.ps.add(path, k.Line, "mapping keys must be strings, got %s", describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			merges = append(merges, val)
			continue
		}
		if l, dup := first[k.Value]; dup {
			d.ps.add(keyPath(path, k.Value), k.Line, "duplicate key (first on line %d)", l)
			continue
		}
		first[k.Value] = k.Line
		out = append(out, pair{k, val})
	}
	for _, m := range merges {
		m = d.resolve(m)
		if m == nil {
			return out
		}
		var sources []*yaml.Node
		switch m.Kind {
		case yaml.MappingNode:
			sources = []*yaml.Node{m}
		case yaml.SequenceNode:
			for _, e := range m.Content {
				if e = d.resolve(e); e == nil {
					return out
				}
				sources = append(sources, e)
			}
		}
		for _, src := range sources {
			if src.Kind != yaml.MappingNode {
				d.ps.add(path, m.Line, "<< merges a mapping or a list of mappings, got %s", describe(src))
				continue
			}
			if d.merging[src] {
				d.ps.add(path, m.Line, "<< merges a mapping into itself")
				continue
			}
			d.merging[src] = true
			for _, kv := range d.pairs(src, path) {
				if _, ok := first[kv.key.Value]; ok {
					continue
				}
				first[kv.key.Value] = kv.key.Line
				out = append(out, kv)
			}
			delete(d.merging, src)
		}
	}
	return out
}

// unknownKey explains an unknown key, suggesting a known one when it is
// probably a typo.
func unknownKey(name string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
		if strings.EqualFold(k, name) {
			best = k
			break
		}
		if dist := levenshtein(strings.ToLower(k), strings.ToLower(name)); dist < bestDist && len(name) > 2 {
			best, bestDist = k, dist
		}
	}
	if best != "" {
		return fmt.Sprintf("unknown key (did you mean %q?)", best)
	}
	return "unknown key (known: " + strings.Join(known, ", ") + ")"
}

// levenshtein is the edit distance of short ASCII keys.
func levenshtein(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
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
