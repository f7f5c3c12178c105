// Package modeltest is the in-process reference for distributed training of
// package model: it runs N simulated ranks in one goroutine, with the
// cross-rank collectives replaced by model.TreeSum (the same pairwise tree,
// in rank order, that a deterministic all-reduce or reduce-scatter
// computes). A real trainer on N processes with a deterministic
// communicator must reproduce its losses and parameters bit for bit, so its
// tests can compare against Run instead of against hand-copied numbers.
//
// It owns nothing but that simulation; the network, data and optimizer are
// package model's, and the real collectives are comm's.
package modeltest
