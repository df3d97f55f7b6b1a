/**
 * DevicePeer.clone against a ublk-manager that is gone: the retries on UNAVAILABLE run into the
 * clone's deadline, and the answer says the manager is unavailable (UNAVAILABLE), not that the
 * clone was too slow (DEADLINE_EXCEEDED, which a fork answers as a freeze window overrun).
 */
import net from 'node:net';
import path from 'node:path';
import { DeadlineExceededError, UnavailableError } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { DevicePeer } from './device-peer';

describe('DevicePeer.clone', () => {
  const tmp = useTempDir('sandnode-device-peer-');

  it('a ublk-manager that is gone (no socket) is UNAVAILABLE naming ublk-manager, also when the retries meet the deadline', async () => {
    const peer = new DevicePeer(`unix://${path.join(tmp(), 'gone.sock')}`, { timeoutMs: 2000 });
    try {
      const err = await peer.clone('sb-1-upper', 'sb-0-upper', true, 300).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(UnavailableError);
      expect((err as Error).message).toMatch(/^ublk-manager CloneDevice: UNAVAILABLE until the deadline /);
      expect((err as Error).message).not.toMatch(/sock/); // grpc-js's text (the socket path) stays in the log
    } finally {
      peer.channel.close();
    }
  });

  it('a ublk-manager that is there but does not answer in time stays DEADLINE_EXCEEDED', async () => {
    const sock = path.join(tmp(), 'mute.sock');
    const conns = new Set<net.Socket>();
    const mute = net.createServer((s) => void conns.add(s)); // accepts, never speaks HTTP/2
    await new Promise<void>((r) => mute.listen(sock, r));
    const peer = new DevicePeer(`unix://${sock}`, { timeoutMs: 2000 });
    try {
      const err = await peer.clone('sb-1-upper', 'sb-0-upper', true, 300).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(DeadlineExceededError);
    } finally {
      peer.channel.close();
      for (const s of conns) s.destroy();
      await new Promise((r) => mute.close(r));
    }
  });
});
