package io.kvpool.master.events;

/**
 * msgpack-core reaches for {@code sun.misc.Unsafe} unless told to use its portable buffers, and JDK 24
 * and later warn about that on stderr. The portable buffers are plenty for payloads of this size, so
 * every class here that packs or unpacks calls {@link #portable()} before msgpack-core loads its buffers.
 */
final class MsgpackBuffers {

    private MsgpackBuffers() {
    }

    /** Selects msgpack-core's portable buffers, unless the process chose already. */
    static void portable() {
        if (System.getProperty("msgpack.universal-buffer") == null) {
            System.setProperty("msgpack.universal-buffer", "true");
        }
    }
}
