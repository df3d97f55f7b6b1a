#!/usr/bin/env node
/**
 * health-probe.js: the Kubernetes exec probe of a sandnode daemon. Calls
 * grpc.health.v1.Health/Check (service "" = the whole daemon) on ADDRESS and exits 0 only when
 * the answer is SERVING; 1 otherwise (NOT_SERVING, no answer within the timeout, no socket),
 * with one line on stderr saying why (the kubelet shows it in the probe's event).
 *
 *   node deploy/health-probe.js unix:///run/sandnode/vmm-supervisor.sock [--timeout-ms 3000]
 *
 * Why an exec probe and not `grpc: {port}`: the kubelet's gRPC probe dials the pod IP on a TCP
 * port. vmm-supervisor and ublk-manager serve only unix sockets (their APIs mutate the node and
 * must not be on the pod network), and the server's public TCP port moves between the slots at
 * handover, so a gRPC probe on it would check whichever slot holds it, not this container's
 * daemon. This script checks the daemon of its own container, on its own socket, with the
 * same nice-grpc + grpc.health.v1 code the daemons serve.
 */
'use strict';
const { createChannel, createClient } = require('nice-grpc');
const { HealthDefinition } = require('nice-grpc-server-health');

const args = process.argv.slice(2);
const address = args.find((a) => !a.startsWith('--'));
const t = args.indexOf('--timeout-ms');
const timeoutMs = t >= 0 ? Number(args[t + 1]) : 3000;
if (!address || !(timeoutMs > 0)) {
  process.stderr.write('usage: health-probe.js ADDRESS [--timeout-ms N]\n');
  process.exit(2);
}

const SERVING = 1; // grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING
const channel = createChannel(address);
const client = createClient(HealthDefinition, channel);
client
  .check({ service: '' }, { signal: AbortSignal.timeout(timeoutMs) })
  .then((r) => {
    if (r.status === SERVING) process.exitCode = 0;
    else {
      process.stderr.write(`${address}: not serving (status ${r.status})\n`);
      process.exitCode = 1;
    }
  })
  .catch((err) => {
    process.stderr.write(`${address}: ${err && err.message ? err.message : String(err)}\n`);
    process.exitCode = 1;
  })
  .finally(() => channel.close());
