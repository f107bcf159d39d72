"""iotune/sweeps/: a sweep from presets and options to a plan of points and steps, run locally or as a
batch job, and the sweep's own manifest and output directory."""
