"""vLLM's connector base classes for ``kvpool.vllm``: the real ones where vLLM is installed, else stand-ins with
the same names and the non-abstract methods' defaults, so the connector imports and behaves alike anywhere."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

__all__ = ["HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole", "KVConnectorTransferResults",
           "SupportsHMA"]

try:  # vLLM present: subclass the real base class
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found]
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA,
    )
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found]
            KVConnectorTransferResults,
        )
    except ImportError:  # older vLLM: no per-request load failures
        KVConnectorTransferResults = None
    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - any import failure means: no usable vLLM here
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        """Stand-in for vLLM's ``KVConnectorRole``."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``KVConnectorMetadata``."""

    class SupportsHMA:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``SupportsHMA`` marker (a connector that takes several KV cache groups)."""

    @dataclass
    class KVConnectorTransferResults:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``KVConnectorTransferResults``."""

        finished_sending: set = field(default_factory=set)
        finished_recving: set = field(default_factory=set)
        failed_recving: set = field(default_factory=set)

    class KVConnectorBase_V1:  # type: ignore[no-redef]  # noqa: N801
        """Stand-in for vLLM's ``KVConnectorBase_V1``: the same constructor and the non-abstract
        methods' defaults, so the connector behaves as it would under vLLM."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> Any:
            return self._role

        @property
        def prefer_cross_layer_blocks(self) -> bool:
            return False

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches: dict) -> None:
            return None

        def register_cross_layers_kv_cache(self, kv_cache: Any, attn_backend: Any) -> None:
            return None

        def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
            return None

        def handle_preemptions(self, preempted_req_ids: Any) -> None:
            return None

        def get_finished(self, finished_req_ids: set) -> tuple:
            return None, None

        def get_block_ids_with_load_errors(self) -> set:
            return set()

        def shutdown(self) -> None:
            return None

        def get_kv_connector_stats(self) -> Any:
            return None

        def get_kv_connector_kv_cache_events(self) -> Any:
            return None

        def get_handshake_metadata(self) -> Any:
            return None

        def update_connector_output(self, connector_output: Any) -> None:
            return None

        def request_finished(self, request: Any, block_ids: list) -> tuple:
            return False, None

        def take_events(self) -> Iterable:
            return ()

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
            return None

        def get_finished_count(self) -> Optional[int]:
            return None

        def reset_cache(self) -> Optional[bool]:
            return None
