package io.kvpool.node;

import java.io.IOException;
import java.nio.file.FileSystems;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.FileAttribute;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.nio.file.attribute.UserPrincipalNotFoundException;
import java.util.Set;

/**
 * Who may open a node's segment file, which holds every value stored on the node: the node's user
 * alone (mode 0600, the default), or also the members of one group the operator chose (mode 0660,
 * the file's group set to it), so that same-machine clients running as other users in that group can
 * map it. A file is always created 0600 and widened only after its group is set, so it is never
 * open to a group other than the chosen one; a file taken over from a previous run is set to the
 * current choice before it is used, whatever it was.
 */
final class SegmentAccess {

    static final SegmentAccess OWNER_ONLY = new SegmentAccess(null, null);

    private static final Set<PosixFilePermission> OWNER_RW = PosixFilePermissions.fromString("rw-------");
    private static final Set<PosixFilePermission> GROUP_RW = PosixFilePermissions.fromString("rw-rw----");

    /** Null: owner only. */
    private final String groupName;
    private final GroupPrincipal group;

    private SegmentAccess(String groupName, GroupPrincipal group) {
        this.groupName = groupName;
        this.group = group;
    }

    /**
     * The access for {@code shm}'s group; owner only when there is none. Throws an
     * IllegalArgumentException naming the group when this machine has no group of that name.
     */
    static SegmentAccess of(ShmDir shm) {
        if (shm == null || shm.group() == null) {
            return OWNER_ONLY;
        }
        try {
            return new SegmentAccess(shm.group(),
                    FileSystems.getDefault().getUserPrincipalLookupService().lookupPrincipalByGroupName(shm.group()));
        } catch (UserPrincipalNotFoundException e) {
            throw new IllegalArgumentException("node: --shm-group " + shm.group() + ": no such group on this machine"
                    + " (create it, or omit --shm-group to keep segment files to the node's user)");
        } catch (IOException | UnsupportedOperationException e) {
            throw new IllegalArgumentException("node: --shm-group " + shm.group() + ": cannot look the group up ("
                    + e.getMessage() + ")");
        }
    }

    /** The mode a new file is created with: the owner's alone, whatever the final access (see the class comment). */
    static FileAttribute<Set<PosixFilePermission>> atCreation() {
        return PosixFilePermissions.asFileAttribute(OWNER_RW);
    }

    /**
     * Gives {@code file} this access: its group first (not following a link), then its mode.
     *
     * <p>By path, never through a new descriptor: the caller holds the file's POSIX lock, which the
     * kernel drops when this process closes <em>any</em> descriptor of the file (see
     * {@link SegmentMemory}). {@code lchown} and {@code chmod} open nothing; the file was opened
     * without following links, in a directory only its owner may rename in ({@code /dev/shm} is sticky).
     *
     * @throws Refused when the group or mode cannot be set (the node's user is not in the group)
     */
    void apply(Path file) {
        try {
            if (group != null) {
                PosixFileAttributeView view = Files.getFileAttributeView(file, PosixFileAttributeView.class,
                        LinkOption.NOFOLLOW_LINKS);
                if (view == null) {
                    throw new IOException("the file system has no POSIX permissions");
                }
                view.setGroup(group);
            }
            Files.setPosixFilePermissions(file, group != null ? GROUP_RW : OWNER_RW);
        } catch (IOException | UnsupportedOperationException e) {
            throw new Refused("cannot give segment file " + file + " " + this + ": " + e.getMessage()
                    + (group != null ? " (the node's user must own the file and be a member of " + groupName + ")" : ""),
                    e);
        }
    }

    @Override
    public String toString() {
        return group == null ? "mode 0600 (the node's user only)" : "mode 0660 and group " + groupName;
    }

    /** The access could not be set on a segment file: the node must not start with it. */
    static final class Refused extends IllegalStateException {
        Refused(String message, Throwable cause) {
            super(message, cause);
        }
    }
}
