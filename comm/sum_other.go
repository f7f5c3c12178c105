//go:build !amd64

package comm

func sumFloat32(d, a, b []float32) { sumT(d, a, b) }
func sumFloat64(d, a, b []float64) { sumT(d, a, b) }
