package sim

// PMIBytes is what gorun sends one host for MPICH's start-up under the
// PMI design of launcher/pmi.go and pmi.Store, counted from Costs' sizes:
//
//   - Union (the old design): every barrier's release carries every
//     host's puts: N cards to every host;
//   - Release: the release now carries the barrier's number only;
//   - Neighbours: a program that reads the cards of the ranks of two
//     other hosts gets two batched answers (pmi-value with the host's
//     batch): O(ranks per host);
//   - AllGather: MPICH's own start-up reads every rank's address on every
//     host (notes/scale.md): one batched answer per other host, O(N) bytes
//     whatever the launcher does, in H−1 round trips instead of N−P.
type PMIBytes struct {
	Union, Release, Neighbours, AllGather int64
	AllGatherTrips                        int64
}

// PMIFence computes PMIBytes for hosts × perHost ranks.
func PMIFence(c Costs, hosts, perHost int) PMIBytes {
	n := int64(hosts * perHost)
	card := int64(c.PMICardBytes)
	batch := int64(c.PMIEnvelopeBytes) + int64(perHost)*card
	return PMIBytes{
		Union:          int64(c.PMIReleaseBytes) + n*card,
		Release:        int64(c.PMIReleaseBytes),
		Neighbours:     int64(c.PMIReleaseBytes) + 2*batch,
		AllGather:      int64(c.PMIReleaseBytes) + int64(hosts-1)*batch,
		AllGatherTrips: int64(hosts - 1),
	}
}
