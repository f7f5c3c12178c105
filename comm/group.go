package comm

import (
	"crypto/sha256"
	"encoding/binary"
)

// Group is the membership a Communicator runs over, as the rendezvous provides
// it. Every method is safe for concurrent use and does not block.
type Group interface {
	Rank() int               // this process's rank in the group
	Size() int               // number of members
	GlobalRank(r int) int    // group rank -> world rank
	Host(r int) string       // host of group rank r
	DataAddr(r int) string   // data-plane address host:port that group rank r advertised
	Failed() <-chan struct{} // closed when any member of the group is lost (never on graceful leave)
	Err() error              // nil until Failed is closed; then an error naming the lost rank and host
}

// GroupID names a group on the wire. Every member computes the same id from
// the member list alone (world ranks and data addresses, in group rank order)
// plus the optional Config.Tag, so no extra round of agreement is needed.
type GroupID uint64

func groupID(g Group, tag string) GroupID {
	h := sha256.New()
	var b [8]byte
	for r := 0; r < g.Size(); r++ {
		binary.LittleEndian.PutUint64(b[:], uint64(g.GlobalRank(r)))
		h.Write(b[:])
		h.Write([]byte(g.DataAddr(r)))
		h.Write([]byte{0})
	}
	h.Write([]byte(tag))
	return GroupID(binary.LittleEndian.Uint64(h.Sum(nil)))
}
