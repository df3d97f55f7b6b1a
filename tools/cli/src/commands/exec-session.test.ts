/**
 * The CLI's ExecStream client against a server of an older release (no ExecStream): the call
 * fails UNIMPLEMENTED before anything is read from stdin, so `sandbox exec` can fall back to
 * Exec with all of stdin; against one with ExecStream, stdin reaches the server as it is read.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import { connectServer } from '@sandnode/node-stack';
import { createLogger, createServiceServer, type ServiceServer } from '@sandnode/shared';
import { SandboxServiceDefinition, type ExecStreamRequest, type ExecStreamResponse } from '@sandnode/shared/proto/server/v1/sandbox';
import { isUnimplemented, runExecSession } from './exec-session';

const log = createLogger('test', '0', 'silent');

describe('CLI exec session', () => {
  let dir: string;
  let server: ServiceServer;
  const seen: string[] = [];
  const realStdin = Object.getOwnPropertyDescriptor(process, 'stdin')!;
  let fake: PassThrough;

  const serve = async (impl: object) => {
    server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log });
    server.add(SandboxServiceDefinition, impl as never);
    await server.listen([`unix://${path.join(dir, 's.sock')}`]);
  };
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'cli-exec-'));
    seen.length = 0;
    fake = new PassThrough();
    Object.defineProperty(process, 'stdin', { value: fake, configurable: true });
  });
  afterEach(async () => {
    Object.defineProperty(process, 'stdin', realStdin);
    await server?.shutdown(0);
    rmSync(dir, { recursive: true, force: true });
  });
  const start = { sandboxId: 'sb-0123456789abcdef', argv: ['cat'], env: {}, cwd: '', timeoutMs: 0, pty: false, detachKeepMs: 0 };

  it('an older server (no ExecStream) is UNIMPLEMENTED and nothing was read from stdin', async () => {
    await serve({});
    fake.write('all of it\n');
    const api = connectServer(`unix://${path.join(dir, 's.sock')}`);
    try {
      const err = await runExecSession(api, { start, stdin: true, raw: false }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isUnimplemented(err)).toBe(true);
    } finally {
      api.close();
    }
    expect(fake.read()?.toString()).toBe('all of it\n');
  });

  it('with ExecStream: stdin is sent as read, the exit code is returned', async () => {
    await serve({
      async *execStream(requests: AsyncIterable<ExecStreamRequest>): AsyncIterable<ExecStreamResponse> {
        for await (const r of requests) {
          const i = r.input;
          if (i?.$case === 'start') yield { event: { $case: 'started', value: { pid: 9, execId: 'ex-0123456789abcdef', pty: false, droppedBytes: 0 } } };
          else if (i?.$case === 'stdin') seen.push(Buffer.from(i.value).toString());
          else if (i?.$case === 'closeStdin') break;
        }
        yield { event: { $case: 'exit', value: { exitCode: 6, signal: '' } } };
      },
    });
    const api = connectServer(`unix://${path.join(dir, 's.sock')}`);
    try {
      const run = runExecSession(api, { start, stdin: true, raw: false });
      fake.write('a');
      await new Promise((r) => setTimeout(r, 50));
      fake.write('b');
      fake.end();
      expect(await run).toBe(6);
    } finally {
      api.close();
    }
    expect(seen.join('')).toBe('ab');
  });
});
