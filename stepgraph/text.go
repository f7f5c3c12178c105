package stepgraph

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The text form is a compact, line-per-node rendering of a graph used by the
// scenario files in testdata/ and handy in logs; JSON (SCHEMA.md) is the
// interchange format. One declaration or node per line, in plan order:
//
//	group NAME SIZE
//	region PATH
//	tensor NAME BYTES [input] [batch|partial|replicated]
//	compute NAME DIR REGION COST [reads=T,..] [writes=T,..] [builtin=B] [chunk=OF/I/N]
//	start NAME DIR REGION OP GROUP DTYPE IN>OUT:BYTES[~FROM],.. [hidden=C,..]
//	wait NAME DIR REGION of=START
//
// DIR is fwd, bwd, opt or -; REGION is a path or -; COST a Go duration.
// Blank lines and lines starting with # are ignored.

// ErrSyntax is wrapped by Parse errors.
var ErrSyntax = errors.New("stepgraph: syntax")

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func undash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// Format renders g in the text form. Parse(Format(g)) gives g back, which is
// what lets golden files print graphs and read them as input alike.
func Format(g *Graph) string {
	var sb strings.Builder
	for _, gr := range g.Groups {
		fmt.Fprintf(&sb, "group %s %d\n", gr.Name, gr.Size)
	}
	for _, r := range g.Regions {
		fmt.Fprintf(&sb, "region %s\n", r)
	}
	for _, t := range g.Tensors {
		fmt.Fprintf(&sb, "tensor %s %d", t.Name, t.Bytes)
		if t.Input {
			sb.WriteString(" input")
		}
		if t.Chunk != "" {
			fmt.Fprintf(&sb, " %s", t.Chunk)
		}
		sb.WriteByte('\n')
	}
	for i := range g.Nodes {
		sb.WriteString(FormatNode(&g.Nodes[i]))
		sb.WriteByte('\n')
	}
	return sb.String()
}

// FormatNode renders one node as a line of the text form.
func FormatNode(n *Node) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %s %s %s", n.Kind, n.Name, dash(dirShort(n.Dir)), dash(n.Region))
	switch n.Kind {
	case Compute:
		fmt.Fprintf(&sb, " %v", n.Cost)
		if len(n.Reads) > 0 {
			fmt.Fprintf(&sb, " reads=%s", strings.Join(n.Reads, ","))
		}
		if len(n.Writes) > 0 {
			fmt.Fprintf(&sb, " writes=%s", strings.Join(n.Writes, ","))
		}
		if n.Builtin != "" {
			fmt.Fprintf(&sb, " builtin=%s", n.Builtin)
		}
		if n.Chunk != nil {
			fmt.Fprintf(&sb, " chunk=%s/%d/%d", n.Chunk.Of, n.Chunk.Index, n.Chunk.Count)
		}
	case Start:
		fmt.Fprintf(&sb, " %s %s %s ", n.Op, n.Group, n.DType)
		for i, m := range n.Members {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, "%s>%s:%d", m.In, m.Out, m.Bytes)
			// From is only worth printing when it differs from the node:
			// authored graphs stay as short as they were written.
			if m.From != "" && m.From != n.Name {
				fmt.Fprintf(&sb, "~%s", m.From)
			}
		}
		if len(n.HiddenBy) > 0 {
			fmt.Fprintf(&sb, " hidden=%s", strings.Join(n.HiddenBy, ","))
		}
	case Wait:
		fmt.Fprintf(&sb, " of=%s", n.Of)
	}
	return sb.String()
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// Parse reads the text form. It does not validate; call Validate.
func Parse(text string) (*Graph, error) {
	g := &Graph{}
	for ln, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if err := parseLine(g, f); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrSyntax, ln+1, err)
		}
	}
	return g, nil
}

// parseLine adds one declaration or node. Positional fields keep the
// scenario files short; optional ones are key=value so they can be added
// without breaking old files.
func parseLine(g *Graph, f []string) error {
	need := func(k int) error {
		if len(f) < k {
			return fmt.Errorf("%s needs %d fields, has %d", f[0], k, len(f))
		}
		return nil
	}
	switch f[0] {
	case "group":
		if err := need(3); err != nil {
			return err
		}
		size, err := strconv.Atoi(f[2])
		if err != nil {
			return err
		}
		g.Groups = append(g.Groups, Group{Name: f[1], Size: size})
		return nil
	case "region":
		if err := need(2); err != nil {
			return err
		}
		g.Regions = append(g.Regions, f[1])
		return nil
	case "tensor":
		// Flags after the size: "input" and a chunk mode, in any order.
		if err := need(3); err != nil {
			return err
		}
		b, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return err
		}
		t := Tensor{Name: f[1], Bytes: b}
		for _, a := range f[3:] {
			if a == "input" {
				t.Input = true
			} else {
				t.Chunk = ChunkMode(a)
			}
		}
		g.Tensors = append(g.Tensors, t)
		return nil
	case "compute", "start", "wait":
	default:
		return fmt.Errorf("unknown line kind %q", f[0])
	}
	if err := need(4); err != nil {
		return err
	}
	dir, err := parseDir(undash(f[2]))
	if err != nil {
		return err
	}
	n := Node{Kind: Kind(f[0]), Name: f[1], Dir: dir, Region: undash(f[3])}
	rest := f[4:]
	switch n.Kind {
	case Compute:
		if len(rest) < 1 {
			return fmt.Errorf("compute %s needs a cost", n.Name)
		}
		if n.Cost, err = time.ParseDuration(rest[0]); err != nil {
			return err
		}
		rest = rest[1:]
	case Start:
		if len(rest) < 4 {
			return fmt.Errorf("start %s needs op, group, dtype and members", n.Name)
		}
		n.Op, n.Group, n.DType = Op(rest[0]), rest[1], rest[2]
		for _, ms := range splitList(rest[3]) {
			// IN>OUT:BYTES, then ~FROM when a pass moved the member.
			var m Member
			ms, m.From, _ = strings.Cut(ms, "~")
			io, bs, ok := strings.Cut(ms, ":")
			if !ok {
				return fmt.Errorf("member %q: want IN>OUT:BYTES", ms)
			}
			if m.In, m.Out, ok = strings.Cut(io, ">"); !ok {
				return fmt.Errorf("member %q: want IN>OUT:BYTES", ms)
			}
			if m.Bytes, err = strconv.ParseInt(bs, 10, 64); err != nil {
				return err
			}
			n.Members = append(n.Members, m)
		}
		rest = rest[4:]
	}
	for _, kv := range rest {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "reads":
			n.Reads = splitList(v)
		case "writes":
			n.Writes = splitList(v)
		case "builtin":
			n.Builtin = Builtin(v)
		case "chunk":
			p := strings.Split(v, "/")
			if len(p) != 3 {
				return fmt.Errorf("chunk %q: want OF/INDEX/COUNT", v)
			}
			idx, err1 := strconv.Atoi(p[1])
			cnt, err2 := strconv.Atoi(p[2])
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			n.Chunk = &ChunkRef{Of: p[0], Index: idx, Count: cnt}
		case "hidden":
			n.HiddenBy = splitList(v)
		case "of":
			n.Of = v
		default:
			return fmt.Errorf("unknown attribute %q", k)
		}
	}
	g.Nodes = append(g.Nodes, n)
	return nil
}
