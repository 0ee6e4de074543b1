package io.kvpool.node;

import io.kvpool.protocol.msg.ControlToken;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;

/**
 * The control token of this node's last registration the master accepted, kept where the node's next
 * run finds it: beside its segment file in the shared-memory directory (the next run adopts it with
 * the file), and in its SSD tier's directory when it has one (that one survives a reboot).
 *
 * <p>Why: a registration under a name the master already holds replaces that segment only if the old
 * one has nobody behind it (its connection closed, its TTL ran out) or the new one proves it is the
 * same node's next run by presenting the old registration's token (protocol 4.16, version 12). Only the
 * node and the master ever had that token: it is never shown, and the file is the node user's alone
 * (mode 0600). A node that kept nothing (a fresh machine, an unreadable file) presents none and waits
 * until the old registration is gone. Failing to read or write the file is logged, never fatal.
 */
final class RegistrationFile {

    private static final Logger log = LoggerFactory.getLogger(RegistrationFile.class);

    private final List<Path> places;
    private volatile boolean warned;

    /**
     * Keeps the token in the SSD tier's directory ({@code diskDir}, locked by its node: null without a
     * tier) and beside the segment file ({@code segmentFile}, null for anonymous memory), which a
     * restarted node takes over with the file it adopts ({@link OrphanedSegments#registrationOf}). Both
     * belong to one running node at a time: another node on the machine, even one misconfigured with
     * the same address, cannot read them.
     */
    RegistrationFile(Path diskDir, Path segmentFile) {
        List<Path> p = new ArrayList<>(2);
        if (diskDir != null) {
            p.add(diskDir.resolve("registration"));
        }
        if (segmentFile != null) {
            p.add(OrphanedSegments.registrationOf(segmentFile));
        }
        this.places = List.copyOf(p);
    }

    /** The token the previous run (or registration) left, or {@link ControlToken#NONE}. */
    ControlToken read() {
        for (Path p : places) {
            try {
                byte[] b = Files.readAllBytes(p);
                if (b.length == ControlToken.BYTES) {
                    return new ControlToken(b);
                }
                log.warn("{} holds {} bytes, not a registration token of {}; ignored", p, b.length, ControlToken.BYTES);
            } catch (NoSuchFileException e) {
                // nothing kept there
            } catch (IOException e) {
                log.warn("cannot read {} ({}); this node's previous registration is not proven from it", p, e.toString());
            }
        }
        return ControlToken.NONE;
    }

    /** Keeps {@code token} (written whole, then renamed over the previous one). */
    void write(ControlToken token) {
        for (Path p : places) {
            Path tmp = p.resolveSibling(p.getFileName() + ".tmp");
            try {
                Files.deleteIfExists(tmp);
                Files.createFile(tmp, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
                Files.write(tmp, token.bytes());
                Files.move(tmp, p, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            } catch (IOException | UnsupportedOperationException e) {
                if (!warned) {
                    warned = true;
                    log.warn("cannot keep this node's registration in {} ({}); a restart then waits until the master"
                            + " lets its previous registration go", p, e.toString());
                }
            }
        }
    }

    /** Forgets the token: the node stops for good, and its next start is not a restart. */
    void delete() {
        for (Path p : places) {
            try {
                Files.deleteIfExists(p);
            } catch (IOException e) {
                log.debug("cannot delete {}: {}", p, e.toString());
            }
        }
    }
}
