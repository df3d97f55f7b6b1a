/**
 * `sandnode certs init` (issue 10 §4): the pairs it makes (openssl) work for the mutual-TLS
 * listener of createServiceServer (serverTlsCredentials): a client with the client pair is
 * served; one without a certificate, or with a certificate of another CA, or plaintext, is
 * not (its call fails, the handler never runs); existing files are kept without --force.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createLogger, createServiceClient, createSandnodeChannel, createServiceServer, serverTlsCredentials, type ServiceServer } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { Status } from 'nice-grpc-common';
import { initCerts, parseSan } from './certs';

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

  it('--san names the server certificate for a remote address: a client dialling 127.0.0.2 is served with it and refused without it (newcomer)', async () => {
    const named = initCerts(path.join(dir, 'c'), false, 'h', ['IP:127.0.0.2', 'DNS:node1.example']);
    const text = execFileSync('openssl', ['x509', '-in', named['server.pem']!, '-noout', '-ext', 'subjectAltName']).toString();
    expect(text).toMatch(/DNS:localhost, IP Address:127\.0\.0\.1, DNS:h, IP Address:127\.0\.0\.2, DNS:node1\.example/);
    const serve = async (f: Record<string, string>) => {
      const srv = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log, auth: {} });
      srv.add(SandboxServiceDefinition, { getSandbox: () => ({}) } as never);
      const l = net.createServer();
      srv.serveListener(l, serverTlsCredentials({ tlsCa: f['ca.pem']!, tlsCert: f['server.pem']!, tlsKey: f['server.key']! }));
      await new Promise<void>((r) => l.listen(0, '127.0.0.2', r));
      return { srv, port: (l.address() as net.AddressInfo).port };
    };
    for (const [f, want] of [
      [named, Status.OK],
      [files, Status.UNAVAILABLE],
    ] as const) {
      const { srv, port: p } = await serve(f);
      try {
        expect(await call(`127.0.0.2:${p}`, { tlsCa: f['ca.pem'], tlsCert: f['client.pem'], tlsKey: f['client.key'] })).toBe(want);
      } finally {
        await srv.shutdown(100);
      }
    }
  });

  it('--san takes IP:, DNS: or a bare address or name, and nothing that could reach the extension file', () => {
    expect(parseSan('IP:192.0.2.2')).toBe('IP:192.0.2.2');
    expect(parseSan('192.0.2.2')).toBe('IP:192.0.2.2');
    expect(parseSan('ip:2001:db8::1')).toBe('IP:2001:db8::1');
    expect(parseSan('node1.example')).toBe('DNS:node1.example');
    expect(parseSan('DNS:*.nodes.example')).toBe('DNS:*.nodes.example');
    for (const bad of ['IP:300.1.1.1', 'DNS:a,IP:1.2.3.4', 'a\nbasicConstraints=CA:TRUE', 'DNS:', 'a b', 'URI:http://x']) expect(() => parseSan(bad)).toThrow(/--san/);
    expect(() => initCerts(path.join(dir, 'd'), false, 'h', ['DNS:a,IP:1.2.3.4'])).toThrow(/--san/);
  });
});
