package ft

import (
	"context"
	"fmt"
)

// LeaveConnections makes the connections of an attempt that failed half
// way, for quorum q as m's Quorum returned it: m builds quorum q's
// communicator again (the replica group's with group, the quorum's
// without), with the tag Quorum uses, and closes it at once. m must be the
// lowest member, which only dials: its connections stay parked at the
// other members' endpoints, which took theirs already, as an attempt's do
// when its peers gave it up before they accepted them.
func (m *Manager) LeaveConnections(ctx context.Context, q Quorum, group bool) error {
	members, tag := q.Participants, quorumTag(q.ID)
	if group {
		members, tag = q.Group, groupTag(q.ID, groupKey(q.Group))
	}
	if len(members) < 2 || members[0].Replica != m.replica {
		return fmt.Errorf("replica %d is not the lowest of %d members %v", m.replica, len(members), members)
	}
	c, err := m.connect(ctx, newGroup(q.ID, 0, members), tag)
	if err != nil {
		return err
	}
	c.Abort(ErrQuorumFailed)
	_ = c.Close() // returns the abort
	return nil
}
