/**
 * authMiddleware on a streaming call of a token caller (issue 10 §4): the token is verified
 * again before each message relayed and every recheckMs, so a revocation ends a running Exec
 * stream UNAUTHENTICATED, whether the handler is between messages or waiting for its next one,
 * and the handler's signal is aborted (the server's Exec then kills the command). A stream of
 * a caller without a token (here TLS is not set up: a unix root caller) is left alone.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createChannel, createClient, Metadata, Status } from 'nice-grpc';
import { createLogger } from './logger';
import { SandboxServiceDefinition, type ExecResponse } from './gen/sandnode/server/v1/sandbox';
import { createServiceServer, type ServiceServer } from './server';
import { UnauthenticatedError, type AuthPolicy } from './connection-auth';

const log = createLogger('test', '0', 'silent');
const isRoot = process.getuid?.() === 0;
const rootIt = isRoot ? it : it.skip;

describe('authMiddleware on the Exec stream of a token that is revoked', () => {
  let dir: string;
  let server: ServiceServer;
  let port: number;
  let sock: string;
  const revoked = new Set<string>();
  /** per stream (keyed by its first argv word): a gate the handler waits on before each message, and whether its signal was aborted */
  const streams = new Map<string, { next: () => void; aborted: Promise<void> }>();
  const policy: AuthPolicy = {
    recheckMs: 20,
    verifyToken: (s) => {
      if (revoked.has(s)) throw new UnauthenticatedError(`token ${s} was revoked`);
      return { name: s, role: 'admin' };
    },
  };

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'conn-auth-'));
    server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log, auth: policy });
    server.add(SandboxServiceDefinition, {
      // yields one stdout message each time the test opens its gate, until the caller or the middleware aborts
      async *exec(req: { argv: string[] }, ctx: { signal: AbortSignal }): AsyncIterable<ExecResponse> {
        let credits = 0;
        let wake: () => void = () => undefined;
        const aborted = new Promise<void>((r) => ctx.signal.addEventListener('abort', () => r(), { once: true }));
        streams.set(req.argv[0]!, { next: () => (credits++, wake()), aborted });
        for (let i = 0; ; i++) {
          while (credits === 0 && !ctx.signal.aborted) await Promise.race([new Promise<void>((r) => (wake = r)), aborted]);
          if (ctx.signal.aborted) return;
          credits--;
          yield { event: { $case: 'stdout', value: Buffer.from(`line ${i}\n`) } };
        }
      },
    } as never);
    const t = net.createServer();
    const u = net.createServer();
    server.serveListener(t);
    server.serveListener(u);
    await new Promise<void>((r) => t.listen(0, '127.0.0.1', r));
    sock = path.join(dir, 'api.sock');
    await new Promise<void>((r) => u.listen(sock, r));
    port = (t.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    await server.shutdown(100);
    rmSync(dir, { recursive: true, force: true });
  });

  const bearer = (s: string) => ({ metadata: new Metadata().set('authorization', `Bearer ${s}`) });
  const execReq = (name: string) => ({ sandboxId: 'x', argv: [name], stdin: Buffer.alloc(0), cwd: '', env: {}, timeoutMs: 0 });
  const until = async (name: string) => {
    while (!streams.has(name)) await new Promise((r) => setImmediate(r));
    return streams.get(name)!;
  };

  it('a revocation while the handler waits ends the stream UNAUTHENTICATED and aborts the handler', async () => {
    const c = createClient(SandboxServiceDefinition, createChannel(`127.0.0.1:${port}`));
    const it = c.exec(execReq('waiting'), bearer('waiting'))[Symbol.asyncIterator]();
    const first = it.next();
    const s = await until('waiting');
    s.next();
    expect((await first).value?.event?.$case).toBe('stdout');
    revoked.add('waiting');
    // the handler never yields again: only the timer's check can end the stream
    const err = await it.next().then(
      () => undefined,
      (e: { code?: Status; details?: string }) => e,
    );
    expect(err?.code).toBe(Status.UNAUTHENTICATED);
    expect(err?.details).toMatch(/Exec: token waiting was revoked; the stream was ended/);
    await s.aborted; // resolves only when the handler's signal was aborted
  });

  it('a message the handler yields after the revocation is not relayed', async () => {
    const c = createClient(SandboxServiceDefinition, createChannel(`127.0.0.1:${port}`));
    const policyMs = policy.recheckMs;
    policy.recheckMs = 3_600_000; // only the check before each message can catch it
    try {
      const it = c.exec(execReq('between'), bearer('between'))[Symbol.asyncIterator]();
      const first = it.next();
      const s = await until('between');
      s.next();
      expect((await first).value?.event?.$case).toBe('stdout');
      revoked.add('between');
      const second = it.next();
      s.next();
      await expect(second).rejects.toMatchObject({ code: Status.UNAUTHENTICATED });
      await s.aborted;
    } finally {
      policy.recheckMs = policyMs;
    }
  });

  rootIt('the stream of a caller without a token (root on the unix socket) is not checked', async () => {
    const c = createClient(SandboxServiceDefinition, createChannel(`unix://${sock}`));
    const it = c.exec(execReq('unix'))[Symbol.asyncIterator]();
    const got: string[] = [];
    for (let i = 0; i < 3; i++) {
      const n = it.next();
      (await until('unix')).next();
      got.push(String((await n).value?.event?.$case));
    }
    expect(got).toEqual(['stdout', 'stdout', 'stdout']);
    await it.return?.(undefined);
  });
});

/**
 * The role authMiddleware found reaches the handler as ctx.callerRole (SandnodeCallContext), on a
 * unary call and on a token caller's stream (tokenGuarded) alike; a client cannot choose it (a
 * `callerRole` metadata field is only metadata), and a server without a policy sets none.
 */
describe('authMiddleware hands the caller role to the handler', () => {
  let server: ServiceServer;
  let bare: ServiceServer;
  let port: number;
  let barePort: number;
  const seen: (string | undefined)[] = [];
  const impl = {
    async getSandbox(_req: unknown, ctx: { callerRole?: string }) {
      seen.push(ctx.callerRole);
      return {};
    },
    async *downloadFile(_req: unknown, ctx: { callerRole?: string }) {
      seen.push(ctx.callerRole);
      yield { part: { $case: 'data', value: Buffer.from('x') } };
    },
  } as never;
  const listen = async (s: ServiceServer) => {
    const t = net.createServer();
    s.serveListener(t);
    await new Promise<void>((r) => t.listen(0, '127.0.0.1', r));
    return (t.address() as net.AddressInfo).port;
  };

  beforeAll(async () => {
    const policy: AuthPolicy = { verifyToken: (s) => ({ name: s, role: s === 'reader' ? 'read' : 'admin' }) };
    server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log, auth: policy });
    server.add(SandboxServiceDefinition, impl);
    port = await listen(server);
    bare = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log });
    bare.add(SandboxServiceDefinition, impl);
    barePort = await listen(bare);
  });
  afterAll(async () => {
    await server.shutdown(100);
    await bare.shutdown(100);
  });

  const calls = async (p: number, metadata: Metadata) => {
    const c = createClient(SandboxServiceDefinition, createChannel(`127.0.0.1:${p}`));
    seen.length = 0;
    await c.getSandbox({ sandboxId: 'x' }, { metadata });
    for await (const _ of c.downloadFile({ sandboxId: 'x', path: 'f', offset: 0 }, { metadata })) void _;
    return [...seen];
  };

  it('read token: "read" on the unary and the streaming call; admin token: "admin"; a client-sent callerRole changes nothing', async () => {
    expect(await calls(port, new Metadata().set('authorization', 'Bearer reader').set('callerrole', 'admin'))).toEqual(['read', 'read']);
    expect(await calls(port, new Metadata().set('authorization', 'Bearer owner'))).toEqual(['admin', 'admin']);
  });

  it('a server without an AuthPolicy sets no role (its callers are all admins)', async () => {
    expect(await calls(barePort, new Metadata().set('callerrole', 'read'))).toEqual([undefined, undefined]);
  });
});
