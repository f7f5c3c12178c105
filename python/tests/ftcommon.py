"""What the fault-tolerant torch test programs (ftprog.py, ft_hsdp_prog.py)
share: a job-wide one-time marker, the line format the tests read, and a
quorum that lets a late replacement leave cleanly."""

import os
import sys

import gorun.ft


def once(marks, name):
    """True the first time name is claimed in this job: every incarnation
    of every replica sees the same marker directory, marks."""
    try:
        os.close(os.open(os.path.join(marks, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def say(replica, text):
    sys.stdout.write("RANK %d: %s\n" % (replica, text))
    sys.stdout.flush()


def quorum_or_leave(m, replica):
    """m.start_quorum(); a replacement that came after every other replica
    finished has nothing to heal into (the job's result is theirs): it says
    FINISHED and exits 0."""
    try:
        return m.start_quorum()
    except gorun.ft.JobFinished as e:
        sys.stderr.write("replica %d incarnation %d: %s\n" % (replica, m.incarnation, e))
        say(replica, "FINISHED inc=%d" % m.incarnation)
        m.close()
        sys.stdout.flush()
        os._exit(0)
