package hostfile

// Host is one entry of a host list: a machine name and how many ranks it
// takes. Duplicate names in a hostfile add their slots; the first occurrence
// keeps its position in the host order.
type Host struct {
	// Name is the host name as written by the user (zero padding of hostlist
	// expressions kept).
	Name string
	// Slots is the number of ranks the host takes before it is full; at least 1.
	Slots int
	// MaxSlots caps oversubscription on this host; 0 means no cap.
	MaxSlots int
}
