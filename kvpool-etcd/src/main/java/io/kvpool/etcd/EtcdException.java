package io.kvpool.etcd;

import java.io.IOException;

/** etcd could not be reached, or refused a request; the message names the endpoints or the error. */
public class EtcdException extends IOException {

    public EtcdException(String message) {
        super(message);
    }

    public EtcdException(String message, Throwable cause) {
        super(message, cause);
    }
}
