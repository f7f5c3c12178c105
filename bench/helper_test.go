package bench

func maybeRankHelper() bool { return false }
