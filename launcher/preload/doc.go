// Package preload owns moving files to the hosts before any rank starts.
//
// Preloading (--preload-binary, --preload-files): gorun sends the program
// and extra files to every host over the agent connections before any rank
// starts, so hosts without a shared file system or an install of the
// program can run it. Each file travels zstd-compressed (compressed once,
// sent to every host), is checked against its SHA-256 on arrival, and is
// not sent at all when the host already holds the same content:
//
//   - the program goes to a content-addressed cache in a directory private
//     to the user (launcher/privdir: $XDG_RUNTIME_DIR/gorun/preload, else
//     ~/.cache/gorun/preload, else $TMPDIR/gorun-<uid>/preload; each level
//     0700, owned by the user, lstat-checked) as <sha256>/<name>, so
//     back-to-back jobs skip the transfer. A cached file is reused only
//     when, opened without following symlinks, it is a regular file of this
//     user that nobody else can write and its content hashes right; since
//     nobody else can write in the directory either, the bytes executed are
//     the bytes checked;
//   - files go to the ranks' working directory on the host, as mpirun's
//     --preload-files does, replaced atomically (write, then rename). A
//     file already there is kept only when it passes the cached program's
//     checks (this user's, nobody else can write it, not a symlink); a
//     working directory of another user's, or one every user may write
//     that is not sticky, is refused, since they could swap the files.
//
// On gorun's side a Source is one file, compressed once, and Send serves
// a host what its agent asked for; on a host, Place says where a file
// goes and whether it is there already, and Receive takes the files in.
// Which files to send, and when, belong to the launcher. Its errors keep
// the "launcher:" prefix users have always seen.
package preload
