/**
 * `sandnode certs init` (issue 10 §4): the pairs it makes (openssl) work for the mutual-TLS
 * listener of createServiceServer (serverTlsCredentials): a client with the client pair is
 * served; one without a certificate, or with a certificate of another CA, or plaintext, is
 * not (its call fails, the handler never runs); existing files are kept without --force.
 */
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createLogger, createServiceClient, createSandnodeChannel, createServiceServer, serverTlsCredentials, type ServiceServer } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { Status } from 'nice-grpc-common';
import { initCerts } from './certs';

const log = createLogger('test', '0', 'silent');

describe('certs init', () => {
  let dir: string;
  let files: Record<string, string>;
  let other: Record<string, string>;
  let server: ServiceServer;
  let port: number;
  let calls = 0;
  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-certs-'));
    files = initCerts(path.join(dir, 'a'));
    other = initCerts(path.join(dir, 'b'));
    server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log, auth: {} });
    server.add(SandboxServiceDefinition, { getSandbox: () => (calls++, {}) } as never);
    const l = net.createServer();
    server.serveListener(l, serverTlsCredentials({ tlsCa: files['ca.pem']!, tlsCert: files['server.pem']!, tlsKey: files['server.key']! }));
    await new Promise<void>((r) => l.listen(0, '127.0.0.1', r));
    port = (l.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    await server?.shutdown(100);
    rmSync(dir, { recursive: true, force: true });
  });

  const call = async (address: string, auth: Parameters<typeof createSandnodeChannel>[1]) => {
    const ch = createSandnodeChannel(address, auth);
    try {
      await createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: 5000, retryAttempts: 0 }).getSandbox({ sandboxId: 'x' });
      return Status.OK;
    } catch (err) {
      return (err as { code?: Status }).code;
    } finally {
      ch.close();
    }
  };

  it('writes a CA, a server and a client pair, keys 0600', () => {
    for (const k of ['ca.key', 'server.key', 'client.key']) expect(statSync(files[k]!).mode & 0o777).toBe(0o600);
  });

  it('the client pair is served over mutual TLS, at localhost and 127.0.0.1 (SAN)', async () => {
    const before = calls;
    const auth = { tlsCa: files['ca.pem'], tlsCert: files['client.pem'], tlsKey: files['client.key'] };
    expect(await call(`127.0.0.1:${port}`, auth)).toBe(Status.OK);
    expect(await call(`localhost:${port}`, auth)).toBe(Status.OK);
    expect(calls).toBe(before + 2);
  });

  it('no client certificate, one of another CA, or plaintext: not served, the handler never runs', async () => {
    const before = calls;
    expect(await call(`127.0.0.1:${port}`, { tlsCa: files['ca.pem'] })).toBe(Status.UNAVAILABLE);
    expect(await call(`127.0.0.1:${port}`, { tlsCa: files['ca.pem'], tlsCert: other['client.pem'], tlsKey: other['client.key'] })).toBe(Status.UNAVAILABLE);
    expect(await call(`127.0.0.1:${port}`, {})).toBe(Status.UNAVAILABLE);
    expect(calls).toBe(before);
  });

  it('keeps files already there unless forced', () => {
    expect(() => initCerts(path.join(dir, 'a'))).toThrow(/already holds ca.pem/);
    expect(Object.keys(initCerts(path.join(dir, 'a'), true))).toContain('client.key');
  });
});
