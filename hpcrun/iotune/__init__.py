"""``hpcrun iotune``: transfer-size and writer sweeps with IOR or fio, Darshan, a recommendation.

Small modules with one job each:

* :mod:`hpcrun.iotune.readers.ior_output` reads IOR 4.0 result files (JSON summary or text output);
* :mod:`hpcrun.iotune.engines.ior_argv` builds IOR command lines and checks them against IOR 4.0's option grammar;
* :mod:`hpcrun.iotune.readers.darshan` summarises Darshan logs (read in a child process by
  :mod:`hpcrun.iotune.readers.darshan_worker`) and compares access sizes with a best transfer size.
* the sweep side: :mod:`~hpcrun.iotune.sweeps.sweep` (model), :mod:`~hpcrun.iotune.sweeps.plan`, the engines
  (:mod:`~hpcrun.iotune.engines.fio`, :mod:`~hpcrun.iotune.engines.ior`), :mod:`~hpcrun.iotune.collect`,
  :mod:`~hpcrun.iotune.advice`, :mod:`~hpcrun.iotune.plot` and :mod:`~hpcrun.iotune.apply`.
"""
