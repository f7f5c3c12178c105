// Package ports owns the two ports a job's rank 0 needs before it starts:
// MASTER_PORT and the rendezvous seed's port, found free on this machine
// and held bound (Reserve) until the caller releases them right before the
// ranks start (Reservation.Release). gorun reserves them for a job whose
// hosts are all this machine, and a host agent for its host; which host's
// ports a job uses, and when to release them, belong to the launcher.
//
// Its errors keep the "launcher:" prefix users have always seen.
package ports
