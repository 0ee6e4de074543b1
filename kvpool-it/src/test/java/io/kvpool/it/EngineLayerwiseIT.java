package io.kvpool.it;

import io.kvpool.connector.PoolConnector;

/**
 * Every {@link EngineIT} test with the connector moving KV layer by layer (ranged reads of each
 * layer, saves written in parts as each layer is computed): the same bit-identical outputs, the same
 * guarantees on resets, weight updates and failed loads.
 */
class EngineLayerwiseIT extends EngineIT {

    @Override
    PoolConnector.Granularity granularity() {
        return PoolConnector.Granularity.LAYER;
    }
}
