package io.kvpool.master;

import java.time.Duration;
import java.time.Instant;
import java.time.InstantSource;

/** A clock that moves only when told to, so timer behaviour is tested without sleeping. */
final class ManualClock implements InstantSource {

    private volatile long millis;

    ManualClock(long startMillis) {
        this.millis = startMillis;
    }

    void advance(Duration d) {
        millis += d.toMillis();
    }

    @Override
    public Instant instant() {
        return Instant.ofEpochMilli(millis);
    }

    @Override
    public long millis() {
        return millis;
    }
}
