/**
 * Status messages are bounded (MAX_STATUS_DETAILS_BYTES): a handler that names a 300 KB bad input
 * in its error used to send it whole in `grpc-message`; the grpc-js client then killed the
 * HTTP/2 connection ("Received RST_STREAM with code 2 ... Protocol error", INTERNAL) and every
 * later call on that channel failed ("The session has been destroyed"). Found by the wire fuzz
 * (podd Stat, AdminService.Handover with a 300 KB path).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { boundDetails, InvalidArgumentError, MAX_STATUS_DETAILS_BYTES } from './errors';
import { createSandnodeChannel, createServiceClient } from './client';
import { createLogger } from './logger';
import { VersionServiceDefinition } from './gen/sandnode/common/v1/version';
import { createServiceServer, type ServiceServer } from './server';

describe('status details', () => {
  it('boundDetails keeps short messages and cuts long ones on a character boundary, saying how much', () => {
    expect(boundDetails('short')).toBe('short');
    const cut = boundDetails(`path: ${'é'.repeat(200_000)} is bad`);
    expect(Buffer.byteLength(cut)).toBeLessThanOrEqual(MAX_STATUS_DETAILS_BYTES);
    expect(cut).toMatch(/^path: é+\.\.\. \(\d+ more bytes cut\)$/);
  });

  describe('over a real channel', () => {
    let dir: string;
    let server: ServiceServer;
    beforeAll(async () => {
      dir = mkdtempSync(path.join(os.tmpdir(), 'details-'));
      server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log: createLogger('test', '0', 'silent') });
      let n = 0;
      // GetVersion stands in for any handler: the first call names a 300 KB input in its error
      server.add(
        { ...VersionServiceDefinition, fullName: 'sandnode.test.v1.Echo', name: 'Echo' } as never,
        {
          getVersion: async () => {
            if (n++ === 0) throw new InvalidArgumentError(`path: ${'/'.repeat(300_000)} is not a path`);
            return { component: 'echo' };
          },
        } as never,
      );
      await server.listen([`unix://${dir}/s.sock`]);
    });
    afterAll(async () => {
      await server.shutdown(0);
      rmSync(dir, { recursive: true, force: true });
    });

    it('a 300 KB message arrives cut, with its code, and the next call on the same channel works', async () => {
      const ch = createSandnodeChannel(`unix://${dir}/s.sock`);
      try {
        const def = { ...VersionServiceDefinition, fullName: 'sandnode.test.v1.Echo', name: 'Echo' } as unknown as typeof VersionServiceDefinition;
        const c = createServiceClient(def, ch, { retryAttempts: 1, timeoutMs: 5000 });
        const err = await c.getVersion({}).then(
          () => undefined,
          (e: { code: Status; details: string }) => e,
        );
        expect(err?.code).toBe(Status.INVALID_ARGUMENT);
        expect(err?.details).toMatch(/^path: \/+\.\.\. \(\d+ more bytes cut\)$/);
        expect((await c.getVersion({})).component).toBe('echo');
      } finally {
        ch.close();
      }
    });
  });
});
