package io.kvpool.web;

import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

import java.util.function.DoubleSupplier;

/**
 * Registers a Prometheus series read from a supplier when scraped: how every kvpool process exports
 * a number it already keeps (an adder, a field, a size), with nothing to update on the hot path.
 */
public final class Series {

    private Series() {
    }

    /** A gauge without labels. */
    public static void gauge(PrometheusRegistry registry, String name, String help, DoubleSupplier value) {
        GaugeWithCallback.builder().name(name).help(help).callback(cb -> cb.call(value.getAsDouble()))
                .register(registry);
    }

    /** A counter without labels ({@code name} ends in {@code _total}; the value never goes down). */
    public static void counter(PrometheusRegistry registry, String name, String help, DoubleSupplier value) {
        CounterWithCallback.builder().name(name).help(help).callback(cb -> cb.call(value.getAsDouble()))
                .register(registry);
    }
}
