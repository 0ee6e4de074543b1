package io.kvpool.connector.config;

import java.util.List;

import io.kvpool.config.Size;

import java.nio.file.Path;
import java.util.Map;
import java.util.Objects;

/**
 * An engine's KV offload configuration, discriminated on {@code type}. Read from YAML or JSON by
 * {@link OffloadConfigs}; turned into a connector (or rendered as vLLM's kv_transfer_config) by
 * {@link ConnectorFactory}.
 *
 * <pre>
 *   type: native            # offload inside the engine process, no servers
 *   cpu: 8GiB               # required
 *   disk:                   # optional
 *     path: /mnt/nvme/kv
 *     size: 100GiB          # optional for native (default: 4 x cpu)
 *
 *   type: pool              # kvpool
 *   cpu: 64GiB              # required: memory each node contributes
 *   disk: {path: /mnt/nvme/kvpool, size: 200GiB}   # optional; size required with a path
 *   promote_after: 2        # disk hits before an object moves back to memory
 *   reset: all              # all (removeAll with fencing) | model (this model's keys)
 *   master: head:50051      # normally filled in by the launcher
 *   shm_group: kvpool       # optional: nodes give their shared-memory segment files to this group
 *                           #   (mode 0660) so same-machine clients of other users in it can map them
 *
 *   versioned_keys: false   # both: weight updates switch key versions instead of resetting
 *   transfer:               # both, optional: a disaggregated-prefill transfer connector, composed
 *     connector: NixlConnector   #   with the offload one through a MultiConnector
 *     role: kv_both
 *     extra: {...}
 * </pre>
 */
public sealed interface OffloadConfig {

    /** Memory tier size (per node for a pool). */
    Size cpu();

    /** The optional disk tier. */
    Disk disk();

    boolean versionedKeys();

    /** An optional transfer connector composed in front of the offload one. */
    Transfer transfer();

    /** A disk tier: a directory and a capacity (null: no disk tier). */
    record Disk(Path path, Size size) {
        public Disk {
            Objects.requireNonNull(path, "disk.path");
        }
    }

    /** A transfer connector, kept as vLLM would name it. */
    record Transfer(String connector, String role, Map<String, Object> extra) {
    }

    /** Offload inside the engine process: a CPU tier and an optional disk tier, LRU. */
    record Native(Size cpu, Disk disk, boolean versionedKeys, Transfer transfer) implements OffloadConfig {
    }

    /**
     * kvpool: each node contributes {@code cpu} of memory and optionally a disk tier; {@code shmGroup}
     * (null: none) is the group its segment file is given to (the node's {@code --shm-group}); {@code tenantsJson}
     * (null: none) the master's tenants, {@code {"tenants": [...]}} as the master reads them (its
     * {@code --tenants-file}; the launcher checks them, the engine side has no use for them); {@code eventFlags}
     * the master's KV event flags from the config's {@code events} ({@code --kv-events-endpoint ...}; empty: off).
     */
    record Pool(Size cpu, Disk disk, int promoteAfter, String reset, String master, boolean versionedKeys,
                Transfer transfer, String shmGroup, String tenantsJson, List<String> eventFlags) implements OffloadConfig {

        public Pool {
            eventFlags = eventFlags == null ? List.of() : List.copyOf(eventFlags);
        }

        /** The same config with the master address the launcher chose. */
        public Pool withMaster(String address) {
            return new Pool(cpu, disk, promoteAfter, reset, address, versionedKeys, transfer, shmGroup, tenantsJson,
                    eventFlags);
        }
    }
}
