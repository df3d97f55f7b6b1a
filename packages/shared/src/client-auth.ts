/**
 * A client's credentials for a server's TCP listener (issue 10 §4): TLS (the CA that signed
 * the server's certificate, and a client pair for mutual TLS) and a bearer token sent as
 * `authorization: Bearer <secret>` on every call. Files are read once, when the channel is made.
 */
import { readFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { Metadata, type ClientMiddleware } from 'nice-grpc';

export interface ClientAuth {
  /** bearer secret (sandnode token create) */
  token?: string;
  /** PEM file of the CA that signed the server's certificate: makes the channel TLS */
  tlsCa?: string;
  /** PEM files of the client's certificate and key (mutual TLS) */
  tlsCert?: string;
  tlsKey?: string;
}

/** channelCredentials: TLS credentials when auth names a CA, else undefined (plaintext). Errors: an Error naming the option whose file cannot be read, or a cert without its key. */
export function channelCredentials(auth: ClientAuth = {}): grpc.ChannelCredentials | undefined {
  if (!auth.tlsCa) {
    if (auth.tlsCert || auth.tlsKey) throw new Error('--tls-cert/--tls-key need --tls-ca (the CA of the server certificate)');
    return undefined;
  }
  if (!auth.tlsCert !== !auth.tlsKey) throw new Error('--tls-cert and --tls-key go together');
  const read = (what: string, p: string | undefined) => {
    if (!p) return null;
    try {
      return readFileSync(p);
    } catch (err) {
      throw new Error(`${what}: cannot read ${p} (${(err as Error).message})`, { cause: err });
    }
  };
  return grpc.credentials.createSsl(read('--tls-ca', auth.tlsCa), read('--tls-key', auth.tlsKey), read('--tls-cert', auth.tlsCert));
}

/** bearerMiddleware adds `authorization: Bearer <token>` to every call (unless the call sets its own). */
export function bearerMiddleware(token: string): ClientMiddleware {
  return async function* bearer(call, options) {
    const metadata = Metadata(options.metadata);
    if (!metadata.has('authorization')) metadata.set('authorization', `Bearer ${token}`);
    return yield* call.next(call.request, { ...options, metadata });
  };
}
