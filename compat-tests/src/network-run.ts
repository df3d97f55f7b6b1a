/**
 * The network part of the upgrade run (issue 12 §4): with the supervisor and the server at N, a
 * networked sandbox holds a TCP connection to the test internet's echo port (not a proxied
 * port: the kernel path, NAT by the vmm-supervisor's rules) that writes a line every 50 ms and
 * counts the bytes echoed back, and serves a web server through the ingress. Then:
 *   1. `upgrade server --dry-run` to N-1 says that ingress and the egress proxy stop and names
 *      the sandbox (PrepareHandover.losses);
 *   2. the server is rolled back to N-1: the connection keeps flowing (more bytes echoed), the
 *      ingress listener is gone (connection refused), the sandbox is still RUNNING;
 *   3. the server is upgraded N-1 -> N again: the ingress answers with the same token (the
 *      record's network survived N-1's rewrites), the connection still flows;
 *   4. the connection is told to stop: every byte it wrote came back, nothing was lost.
 * The sandbox is deleted at the end (the later supervisor rollback runs without it).
 */
import type { Build, UpgradeStep } from './types';
import { connectApi, TempNode } from './node';
import { createRequest, ingressGet, ingressHost, INGRESS_PORT, SERVER_INGRESS_FEATURE, SERVER_NETWORK_FEATURE, startWebServer, VMM_NETWORK_FEATURE } from './network-scenario';
import { execCollect, getSandbox, stateName, type ExecResult } from './scenario-kit';

/** The file whose existence tells the echo client to finish (in /workspace). */
const ECHO_STOP_FILE = 'compat-echo.stop';
/** Longest the echo client runs by itself, ms (a safety bound; it is normally told to stop). */
const ECHO_MAX_MS = 15 * 60_000;

/** What the run's step runner gives this part. */
export interface NetworkRunContext {
  node: TempNode;
  older: Build;
  newer: Build;
  step: (name: string, fn: () => Promise<Partial<UpgradeStep> | void>, extra?: Partial<UpgradeStep>) => Promise<boolean>;
  /** upgradeBy moves the server to build `to` with N's CLI (`upgrade server --from-build`) */
  upgradeServer: (to: Build) => Promise<Partial<UpgradeStep>>;
}

/** echoScript is the client inside the sandbox: prints "connected", then "p SENT GOT" per line written, then "end SENT GOT". */
function echoScript(address: string): string {
  return `const net=require('net'),fs=require('fs');const s=net.connect(7,${JSON.stringify(address)});let sent=0,got=0,n=0;const fin=()=>{console.log('end '+sent+' '+got);s.destroy();process.exit(0)};s.on('data',d=>{got+=d.length});s.on('error',e=>{console.log('error '+(e.code||e.message));process.exit(1)});setTimeout(fin,${ECHO_MAX_MS});s.on('connect',()=>{console.log('connected');const t=setInterval(()=>{if(fs.existsSync('/workspace/${ECHO_STOP_FILE}')){clearInterval(t);const w=setInterval(()=>{if(got>=sent){clearInterval(w);fin()}},20);setTimeout(fin,5000);return}const l='n '+(++n)+'\\n';s.write(l);sent+=l.length;console.log('p '+sent+' '+got)},50)})`;
}

/** runNetworkSteps runs the steps of the file header; each failure is a failed step. */
export async function runNetworkSteps(ctx: NetworkRunContext): Promise<void> {
  const { node, older, newer, step } = ctx;
  const sv = await node.version('server').catch(() => undefined);
  const vv = await node.version('vmm-supervisor').catch(() => undefined);
  if (!sv?.features.includes(SERVER_NETWORK_FEATURE) || !sv.features.includes(SERVER_INGRESS_FEATURE) || !vv?.features.includes(VMM_NETWORK_FEATURE)) {
    const why = `server ${sv?.version} or vmm-supervisor ${vv?.version} lacks ${SERVER_NETWORK_FEATURE}/${SERVER_INGRESS_FEATURE}/${VMM_NETWORK_FEATURE}`;
    await step('network across server moves', async () => ({ result: 'n/a', detail: why }));
    return;
  }
  const inet = node.inet;
  if (!inet) throw new Error('the node has no test internet');
  const streamApi = connectApi(node.address);
  let id = '';
  let token = '';
  let host = '';
  let out = '';
  let stream: Promise<ExecResult> | undefined;
  const body = () => `compat ingress ${id}`;
  /** the last "p SENT GOT" the client printed */
  const progress = (): { sent: number; got: number } => {
    const m = [...out.matchAll(/^p (\d+) (\d+)$/gm)].at(-1);
    return m ? { sent: Number(m[1]), got: Number(m[2]) } : { sent: 0, got: 0 };
  };
  /** flowing waits until more bytes came back than at `since` */
  const flowing = async (since: number, what: string): Promise<number> => {
    const deadline = Date.now() + 10_000;
    while (progress().got <= since) {
      if (/^error /m.test(out) || /^end /m.test(out)) throw new Error(`${what}: the kernel-path connection ended: ${out.split('\n').slice(-3).join(' | ')}`);
      if (Date.now() > deadline) throw new Error(`${what}: no byte echoed within 10 s (echoed ${progress().got}, sent ${progress().sent})`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return progress().got;
  };
  let seen = 0;
  try {
    const ok = await step(`networked sandbox at ${newer.label}: a kernel-path TCP connection to the test internet and ingress`, async () => {
      const r = await node.api.sandboxes.createSandbox(createRequest('new', true, { run: 'upgrade-network' }));
      id = r.sandbox!.sandboxId;
      token = r.accessToken;
      const n = r.sandbox!.network;
      if (!n?.ingressUrl) throw new Error(`${id}: created with network, got ${JSON.stringify(n)}`);
      host = ingressHost(n.ingressUrl, INGRESS_PORT);
      stream = execCollect(streamApi, id, ['node', '-e', echoScript(inet.address)], (c) => (out += c));
      stream.catch(() => undefined);
      seen = await flowing(0, 'at start');
      await startWebServer(node.api, node.ingressListen, id, host, token, body());
      return { detail: `${id} at ${n.address}: TCP to ${inet.address}:7 echoing (${seen} bytes so far); ingress ${host} 200 with the token` };
    });
    if (!ok) return;

    await step(`upgrade server --dry-run ${newer.label} -> ${older.label} names what stops`, async () => {
      const r = await node.cli(['upgrade', 'server', '--from-build', older.dir, '--dry-run', '--json'], TempNode.buildEnv(older));
      if (r.status !== 0) throw new Error(`upgrade server --dry-run exited ${r.status}: ${r.stderr.trim().slice(-600)}`);
      const p = JSON.parse(r.stdout) as { ok: boolean; losses: string[] };
      const all = p.losses.join('\n');
      for (const want of ['server.ingress.v1', 'server.egress-proxy.v1', id, 'kernel network'])
        if (!all.includes(want)) throw new Error(`the losses do not name ${JSON.stringify(want)}: ${JSON.stringify(p.losses)}`);
      if (!p.ok) throw new Error(`the dry-run says the handover would not start: ${r.stdout}`);
      return { detail: `losses: ${p.losses.join(' / ')}` };
    });

    await step(`rollback server ${newer.label} -> ${older.label} with the networked sandbox: the kernel path flows, ingress stops`, async () => {
      const u = await ctx.upgradeServer(older);
      seen = await flowing(progress().got, `after the rollback to ${older.label}`);
      const g = await getSandbox(node.api, id);
      if (stateName(g.state) !== 'RUNNING') throw new Error(`${id} under ${older.label}: ${stateName(g.state)}`);
      const ing = await ingressGet(node.ingressListen, host, token);
      if (ing.status !== 0 || ing.body !== 'ECONNREFUSED')
        throw new Error(`the ingress of a ${older.label} server answered ${ing.status} ${ing.body.slice(0, 100)} (expected connection refused: it has none)`);
      return { ...u, detail: `${u.detail ?? ''}; kernel path still echoing (${seen} bytes); ingress ${node.ingressListen}: connection refused` };
    });

    await step(`upgrade server ${older.label} -> ${newer.label} again: ingress answers with the same token, the kernel path flows`, async () => {
      const u = await ctx.upgradeServer(newer);
      const ing = await ingressGet(node.ingressListen, host, token);
      if (ing.status !== 200 || ing.body !== body()) throw new Error(`ingress after the upgrade gave ${ing.status} ${ing.body.slice(0, 200)}`);
      const g = await getSandbox(node.api, id);
      if (!g.network) throw new Error(`${id}: ${newer.label} reads no network from the record ${older.label} rewrote`);
      seen = await flowing(progress().got, `after the upgrade to ${newer.label}`);
      return { ...u, detail: `${u.detail ?? ''}; ingress 200 with the token; ${id} still at ${g.network.address}; ${seen} bytes echoed` };
    });

    await step('the kernel-path connection ends with every byte echoed', async () => {
      if (!stream) throw new Error('no stream');
      await node.api.sandboxes.writeFile({ sandboxId: id, path: ECHO_STOP_FILE, data: Buffer.from('stop'), mode: 0o644, append: false });
      const r = await Promise.race([stream, new Promise<never>((_, rej) => setTimeout(() => rej(new Error('the echo client did not end within 30 s of the stop file')), 30_000))]);
      const m = /^end (\d+) (\d+)$/m.exec(r.stdout);
      if (!m || r.exitCode !== 0) throw new Error(`the echo client ended with exit ${r.exitCode}: ${r.stdout.split('\n').slice(-3).join(' | ')}`);
      const [sent, got] = [Number(m[1]), Number(m[2])];
      if (got !== sent) throw new Error(`${sent} bytes written, ${got} echoed: ${sent - got} lost`);
      return { timings: { bytesSent: sent, bytesEchoed: got }, detail: `${sent} bytes written, ${got} echoed back through a server rollback and upgrade: 0 lost` };
    });
  } finally {
    streamApi.close();
    if (id) await node.api.sandboxes.deleteSandbox({ sandboxId: id }).catch(() => undefined);
  }
}
