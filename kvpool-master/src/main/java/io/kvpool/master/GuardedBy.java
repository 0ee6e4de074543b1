package io.kvpool.master;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * The lock that guards a field: the field is read and written only while that lock is held. On a
 * method: its caller holds the lock. The value names the lock in words ({@code "lock"} for a field of
 * the same object, {@code "epoch write lock"}, {@code "shard lock"}); the compiler does not check it,
 * reviewers do.
 */
@Documented
@Retention(RetentionPolicy.SOURCE)
@Target({ElementType.FIELD, ElementType.METHOD})
@interface GuardedBy {
    String value();
}
