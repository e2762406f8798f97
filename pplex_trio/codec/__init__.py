"""Opus for the Moshi protocol: our libopus writer, and where the codec work runs.

Kept apart from the server package so that the codec child processes start
fast (they import only this package, numpy, sphn and opuslib).
"""
