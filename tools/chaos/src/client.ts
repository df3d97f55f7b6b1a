/**
 * How the chaos run reaches the node without being fooled by its own process: every channel
 * has its own grpc-js subchannel pool (a call cut off by a kill -9 of the server can leave the
 * process-wide pool's subchannel to that unix socket stuck on the old ECONNREFUSED, so that no
 * channel of the process reaches the restarted server; reported as a finding of the chaos
 * run), and the operator's remedy `sandnode up` runs as its own process, as an operator runs it.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { createChannel, type Channel } from 'nice-grpc';
import { MAX_MESSAGE_BYTES, createServiceClient, type ServiceClientOptions } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { TemplateServiceDefinition } from '@sandnode/shared/proto/server/v1/template';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import type { ServerApi, StackDirs } from '@sandnode/node-stack';

/** Deadline of the chaos client's unary calls, ms. */
const API_TIMEOUT_MS = 45_000;

/** localChannel opens a channel to address with the options of createSandnodeChannel and a subchannel pool of its own. */
export function localChannel(address: string): Channel {
  return createChannel(address, undefined, {
    'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 1000,
    'grpc.use_local_subchannel_pool': 1,
  });
}

/** connectApi is the server's public API at address on a {@link localChannel} (unary deadline 45 s, streams none). */
export function connectApi(address: string, opts: ServiceClientOptions = {}): ServerApi {
  const channel = localChannel(address);
  const o = { timeoutMs: API_TIMEOUT_MS, ...opts };
  return {
    channel,
    sandboxes: createServiceClient(SandboxServiceDefinition, channel, o),
    templates: createServiceClient(TemplateServiceDefinition, channel, o),
    version: createServiceClient(VersionServiceDefinition, channel, o),
    close: () => channel.close(),
  };
}

/**
 * operatorUp runs `sandnode up` (this build's CLI, on this Node) for dirs in its own process,
 * each component given startTimeoutMs (ms) to answer. Throws Error with the CLI's output when
 * it exits non-zero.
 */
export async function operatorUp(dirs: StackDirs, startTimeoutMs: number): Promise<void> {
  const cli = path.join(path.dirname(require.resolve('@sandnode/cli/package.json')), 'dist', 'main.js');
  const args = [cli, '--state-dir', path.resolve(dirs.stateDir), '--run-dir', path.resolve(dirs.runDir), '--listen', dirs.listen, 'up', '--start-timeout-ms', String(startTimeoutMs)];
  try {
    await promisify(execFile)(process.execPath, args, { timeout: 4 * startTimeoutMs });
  } catch (err) {
    const e = err as Error & { stdout?: string; stderr?: string };
    throw new Error(`sandnode up: ${(e.stderr || e.stdout || e.message).trim()}`, { cause: err });
  }
}
