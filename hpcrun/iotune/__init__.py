"""hpcrun iotune: transfer-size and writer sweeps with IOR or fio, Darshan, a recommendation."""
