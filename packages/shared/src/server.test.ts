/**
 * The deadline middleware of createServiceServer: a call whose deadline passed before it was
 * handled, or whose caller already went away, never reaches its handler. Calls go over raw
 * HTTP/2 so that the server really receives a `grpc-timeout` that has run out (a grpc-js client
 * may fail such a call locally without sending it).
 */
import http2 from 'node:http2';
import { Metadata, Status } from 'nice-grpc-common';
import type { CallContext, ServerMiddlewareCall } from 'nice-grpc-common';
import { createLogger } from './logger';
import { SandboxServiceDefinition } from './gen/sandnode/server/v1/sandbox';
import { createServiceServer, deadlineMiddleware, reflectionFor, type ServiceServer } from './server';
import { DEADLINE_METADATA_KEY } from './grpc-host';

const log = createLogger('test', '0', 'silent');

/** rawCall sends one empty request message with the given headers; resolves with grpc-status. */
function rawCall(port: number, rpc: string, headers: Record<string, string>, body: Buffer = Buffer.alloc(5)): Promise<{ status: number; message: string }> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on('error', reject);
    const req = session.request({ ':method': 'POST', ':path': rpc, 'content-type': 'application/grpc', te: 'trailers', ...headers });
    let status: number | undefined;
    let message = '';
    const take = (h: http2.IncomingHttpHeaders) => {
      if (h['grpc-status'] !== undefined) {
        status = Number(h['grpc-status']);
        message = decodeURIComponent(String(h['grpc-message'] ?? ''));
      }
    };
    req.on('response', take);
    req.on('trailers', take);
    req.on('data', () => undefined);
    req.on('error', reject);
    req.on('close', () => {
      session.close();
      if (status === undefined) reject(new Error(`${rpc}: no grpc-status`));
      else resolve({ status, message });
    });
    req.end(body); // default: one message of 0 bytes
  });
}

describe('createServiceServer deadline middleware', () => {
  let server: ServiceServer;
  let port: number;
  const calls = { getSandbox: 0, exec: 0 };

  beforeAll(async () => {
    server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log });
    server.add(SandboxServiceDefinition, {
      getSandbox: async () => {
        calls.getSandbox++;
        return {};
      },
      exec: async function* () {
        calls.exec++;
        yield { started: { pid: 1 } };
      },
    } as never);
    [port] = (await server.listen(['127.0.0.1:0'])) as [number];
  });
  afterAll(async () => {
    await server.shutdown(100);
  });
  beforeEach(() => {
    calls.getSandbox = 0;
    calls.exec = 0;
  });

  const GET = '/sandnode.server.v1.SandboxService/GetSandbox';
  const EXEC = '/sandnode.server.v1.SandboxService/Exec';

  it.each(['1n', '1u', '0m'])('a unary and a streaming call with grpc-timeout %s answer DEADLINE_EXCEEDED and never reach the handler', async (t) => {
    for (let i = 0; i < 5; i++) {
      expect((await rawCall(port, GET, { 'grpc-timeout': t })).status).toBe(Status.DEADLINE_EXCEEDED);
      expect((await rawCall(port, EXEC, { 'grpc-timeout': t })).status).toBe(Status.DEADLINE_EXCEEDED);
    }
    expect(calls).toEqual({ getSandbox: 0, exec: 0 });
  });

  it('a call with time left, or without a deadline, reaches the handler', async () => {
    expect((await rawCall(port, GET, { 'grpc-timeout': '10S' })).status).toBe(Status.OK);
    expect((await rawCall(port, EXEC, { 'grpc-timeout': '10S' })).status).toBe(Status.OK);
    expect((await rawCall(port, GET, {})).status).toBe(Status.OK);
    expect(calls).toEqual({ getSandbox: 2, exec: 1 });
  });

  it("a client cannot send its own deadline stamp: the host replaces it with the call's", async () => {
    expect((await rawCall(port, GET, { [DEADLINE_METADATA_KEY]: '1' })).status).toBe(Status.OK);
    expect((await rawCall(port, GET, { [DEADLINE_METADATA_KEY]: String(Date.now() + 60_000), 'grpc-timeout': '1n' })).status).toBe(Status.DEADLINE_EXCEEDED);
    expect(calls.getSandbox).toBe(1);
  });

  it('a call whose signal is already aborted on arrival never reaches the handler', async () => {
    let reached = 0;
    const ac = new AbortController();
    ac.abort();
    const call = {
      method: { path: GET },
      request: {},
      // eslint-disable-next-line require-yield
      next: async function* () {
        reached++;
        return {};
      },
    } as unknown as ServerMiddlewareCall<object, object>;
    const ctx = { metadata: Metadata(), signal: ac.signal } as unknown as CallContext;
    await expect(deadlineMiddleware(call, ctx).next()).rejects.toThrow(/deadline passed before it was handled/);
    // the same call with a live signal goes through
    await expect(deadlineMiddleware(call, { ...ctx, signal: new AbortController().signal }).next()).resolves.toEqual({ done: true, value: {} });
    expect(reached).toBe(1);
  });

  /** frame wraps payload as one uncompressed gRPC message. */
  const frame = (payload: Buffer) => Buffer.concat([Buffer.from([0, 0, 0, 0, payload.length]), payload]);

  it('a request that does not decode is INVALID_ARGUMENT, unary and streaming, and never reaches the handler', async () => {
    // field 1 (sandbox_id) as a length-delimited string that claims 100 bytes but has 2; then random bytes
    for (const bad of [Buffer.from([0x0a, 100, 0x61, 0x62]), Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f])]) {
      const unary = await rawCall(port, GET, {}, frame(bad));
      expect(unary.status).toBe(Status.INVALID_ARGUMENT);
      expect(unary.message).toMatch(/GetSandbox: the request is not a valid message of its type .*nothing was done/);
      expect((await rawCall(port, EXEC, {}, frame(bad))).status).toBe(Status.INVALID_ARGUMENT);
    }
    expect(calls).toEqual({ getSandbox: 0, exec: 0 });
    // a valid request still reaches the handler
    expect((await rawCall(port, GET, {})).status).toBe(Status.OK);
    expect(calls.getSandbox).toBe(1);
  });
});

describe('reflectionFor', () => {
  it('parses the descriptor set once per set of service names (the vmm-supervisor runs one server per VM)', () => {
    const a = reflectionFor(['sandnode.common.v1.VersionService', 'sandnode.vmm.v1.FreezePortService']);
    expect(reflectionFor(['sandnode.common.v1.VersionService', 'sandnode.vmm.v1.FreezePortService'])).toBe(a);
    expect(reflectionFor(['sandnode.common.v1.VersionService'])).not.toBe(a);
  });
});
