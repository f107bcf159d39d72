"""iotune/readers/: what I/O tools wrote: IOR's output, Darshan logs (read in a worker process)."""
