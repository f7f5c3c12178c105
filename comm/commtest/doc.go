// Package commtest is test support for comm and its consumers: an in-memory
// network implementing comm.Transport with fault injection (kill a member,
// drop its frames, delay every frame), comm.StaticGroup under its old
// name, and a straightforward reference implementation of
// every collective that tests compare comm's results against.
//
// The in-memory network is deterministic: frames between two members arrive
// in order, sends never block, and nothing depends on timing unless a test
// asks for a delay.
package commtest
