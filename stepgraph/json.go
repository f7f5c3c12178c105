package stepgraph

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// SchemaVersion names the JSON schema this package reads and writes. A
// reader rejects any other value: a step exported by another framework must
// say which schema it follows. The schema is described in SCHEMA.md.
const SchemaVersion = "gorun.stepgraph/v1"

// ErrSchema is wrapped by Load errors about the document's shape.
var ErrSchema = errors.New("stepgraph: schema")

// document is the JSON object: the schema tag next to the graph's own
// fields (embedded, so the schema table in SCHEMA.md is the Graph's tags).
type document struct {
	Schema string `json:"schema"`
	Graph
}

// Save writes g as an indented JSON document of the current schema.
func Save(w io.Writer, g *Graph) error {
	b, err := json.MarshalIndent(document{Schema: SchemaVersion, Graph: *g}, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Load reads a JSON document, rejecting unknown fields and other schema
// versions, and validates the graph.
func Load(r io.Reader) (*Graph, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	// An unknown field is most likely a field of a newer schema or a typo;
	// either way silently dropping it could change the plan.
	dec.DisallowUnknownFields()
	var doc document
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSchema, err)
	}
	if doc.Schema != SchemaVersion {
		return nil, fmt.Errorf("%w: document says schema %q, this reader knows %q", ErrSchema, doc.Schema, SchemaVersion)
	}
	g := doc.Graph
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return &g, nil
}
