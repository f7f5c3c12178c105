// Package funclen holds no code, only a test over the whole module: no
// function may run over MaxLines lines unless its doc comment gives the
// reason on a line starting "long:", as in
//
//	// long: one switch over the wire commands; split up, a reader would
//	// hop between a dozen functions to see what a connection can be asked.
package funclen

// MaxLines is the longest a function may be, from its func line to its
// closing brace, without a "long:" reason.
const MaxLines = 120
