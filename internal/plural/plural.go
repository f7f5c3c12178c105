// Package plural chooses between a word's singular and plural for a
// count, so that gorun's messages say "1 rank" and "3 ranks". It knows no
// English: the caller names both forms ("process", "processes").
package plural

// Noun returns one when n is 1 and many otherwise (0 takes the plural:
// "stopped 0 ranks").
func Noun(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
