package funclen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// longFunc is one function over MaxLines.
type longFunc struct {
	key    string // "path/file.go Recv.Name"
	pos    string // file:line, for messages
	lines  int
	reason bool // its doc comment has a "long:" line
}

func TestNoLongFunctionsWithoutReason(t *testing.T) {
	found, err := longFuncs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		if !f.reason {
			t.Errorf("%s: %s is %d lines (over %d): break it into named steps, or say why it is better whole in a \"// long:\" line of its doc comment",
				f.pos, f.key, f.lines, MaxLines)
		}
	}
}

// longFuncs parses every Go file under root (skipping testdata, hidden
// and vendor directories) and returns its functions over MaxLines.
func longFuncs(root string) ([]longFunc, error) {
	fset := token.NewFileSet()
	var out []longFunc
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start := fset.Position(fd.Pos())
			n := fset.Position(fd.End()).Line - start.Line + 1
			if n <= MaxLines {
				continue
			}
			out = append(out, longFunc{
				key:    filepath.ToSlash(rel) + " " + funcName(fd),
				pos:    filepath.ToSlash(rel) + ":" + strconv.Itoa(start.Line),
				lines:  n,
				reason: hasReason(fd.Doc),
			})
		}
		return nil
	})
	return out, err
}

// funcName is Recv.Name for a method, Name for a function.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// hasReason reports whether a doc comment has a line starting "long:"
// with something after it.
func hasReason(doc *ast.CommentGroup) bool {
	if doc == nil {
		return false
	}
	for _, line := range strings.Split(doc.Text(), "\n") {
		if r, ok := strings.CutPrefix(strings.TrimSpace(line), "long:"); ok && strings.TrimSpace(r) != "" {
			return true
		}
	}
	return false
}
