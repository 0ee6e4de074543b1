"""The peer suite (see conftest.py). A package, so that pytest puts python/ on sys.path for it rather than
this folder, whose subfolders are named after the engines (vllm, sglang, lmcache, mooncake) and would
otherwise import as empty namespace packages of those names in a venv without that engine."""
