package io.kvpool.protocol;

/**
 * What a connection has proven (version 8): nothing, the cluster secret (every data operation), or
 * the admin secret as well (destructive operations and node administration). A server without
 * secrets grants {@link #ADMIN} to everyone.
 */
public enum Access {
    NONE(0),
    DATA(1),
    ADMIN(2);

    /** The level's byte in AUTH_PROVE. */
    public final int code;

    Access(int code) {
        this.code = code;
    }

    public static Access of(int code) {
        for (Access a : values()) {
            if (a.code == code) {
                return a;
            }
        }
        throw new BadRequestException("unknown access level " + code + " (1 data, 2 admin)");
    }

    /** Whether this level allows what {@code needed} allows. */
    public boolean allows(Access needed) {
        return code >= needed.code;
    }
}
