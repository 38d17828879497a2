"""Pure tensor math shared by both backends: quantizers, UAQ, objectives, advantages, metrics.

No backend imports here (docs/math.md lists every function, its equation and its source).
"""
