package io.kvpool.node;

import java.nio.file.Path;

/**
 * Where a node's shared-memory segment file goes, and who besides the node's user may open it.
 *
 * @param path  the directory (normally {@code /dev/shm})
 * @param group null: the file is the node user's alone (mode 0600); a group name: the file is given
 *              to that group, readable and writable by it (mode 0660), so same-machine clients running
 *              as other users in the group can map it. Resolved when the node starts: an unknown group
 *              fails the start.
 */
public record ShmDir(Path path, String group) {

    public ShmDir {
        if (path == null) {
            throw new IllegalArgumentException("node: the shared-memory directory must not be null (no ShmDir means"
                    + " anonymous memory)");
        }
        if (group != null && (group.isBlank() || !group.equals(group.strip()))) {
            throw new IllegalArgumentException("node: --shm-group must be a group name, got '" + group + "'");
        }
    }

    /** The directory, with the file the node user's alone. */
    public static ShmDir ownerOnly(Path path) {
        return new ShmDir(path, null);
    }

    /** The same directory, its segment file given to {@code group} (null: the node user's alone). */
    public ShmDir withGroup(String g) {
        return new ShmDir(path, g);
    }
}
