"""The harness for kvpool's *peers*: the real engines and stores kvpool is measured and tested beside.

Not part of the ``kvpool`` package (which stays standard-library only and is what ``pip install ./python``
installs): these modules import the peers themselves, from the virtual environments
``scripts/peers.sh`` makes (``.peers/NAME/venv``), and are used by ``python/peer_tests`` and by the
benchmarks beside the peers.

* :mod:`kvpool_peers.mooncake`: starts and stops the wheel's ``mooncake_master`` and a
  ``mooncake_client`` store process on loopback, by PID.
* :mod:`kvpool_peers.bench_mooncake`: the Python half of ``kvpool bench --only mooncake``.
* :mod:`kvpool_peers.bench_vllm`: vLLM's time to first token without the pool, saving to it, and
  hitting it (run with the vllm peer's interpreter; docs/benchmarks-python.md).
"""
