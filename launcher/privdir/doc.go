// Package privdir owns the directories private to this user in which
// gorun keeps per-user state on a host (the preload cache, ssh control
// sockets). Such state lives only in directories this user owns with mode
// 0700, checked the way OpenSSH's StrictModes checks ~/.ssh: every
// directory from / down to the base must belong to root or this user and
// be writable by nobody else unless it is sticky (/tmp); the directories
// gorun makes below it must be real directories (never symlinks, checked
// with lstat), owned by this user, with no group or other bits. Another user then cannot create the tree
// first, swap a file in it, or redirect it with a symlink.
//
// Make makes (or checks) one such directory under a base; UserState picks
// the base for a kind of state. A directory that fails the checks is an
// *Error naming it and the problem. Its errors keep the "launcher:" prefix
// users have always seen.
package privdir
