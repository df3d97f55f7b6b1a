/**
 * The two ingress engines (config ingressEngine: raw, node-http) side by side for the network
 * section: each in a process of its own, built from services/server/dist, in front of the same
 * sandbox port with the same private-sandbox token check, so the only difference between the two
 * figures is the engine. (The server's own ingress is measured as the `ingress` target.)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const INGRESS_JS = path.join(ROOT, 'services', 'server', 'dist', 'network', 'ingress.js');
const DIRECTORY_JS = path.join(ROOT, 'services', 'server', 'dist', 'core', 'network-directory.js');
const SHARED_JS = path.join(ROOT, 'packages', 'shared', 'dist', 'index.js');

/** The child: one createIngress of the engine, on 127.0.0.1:0; prints its port; exits when stdin closes. */
const CHILD = String.raw`
const [engine, id, address, sha] = process.argv.slice(1);
const { createIngress } = require(process.env.INGRESS_JS);
const { MapNetworkDirectory } = require(process.env.DIRECTORY_JS);
const { createLogger } = require(process.env.SHARED_JS);
const dir = new MapNetworkDirectory();
dir.set({ sandboxId: id, state: 'RUNNING', slot: 0, address, gateway: address, policy: { allowOut: [], denyOut: [], blockAll: false }, public: false, accessTokenSha256: sha, poddAddress: '' });
const ingress = createIngress({ engine, directory: dir, domain: 'localhost', log: createLogger('bench-ingress', '0', 'silent') });
ingress.server.listen(0, '127.0.0.1', () => process.stdout.write(ingress.server.address().port + '\n'));
process.stdin.resume();
process.stdin.on('end', () => ingress.close().then(() => process.exit(0)));
`;

/** A standalone ingress process: its port, and stop() (ends it, waits for the exit). */
export interface EngineIngress {
  port: number;
  stop(): Promise<void>;
}

/** startEngineIngress runs the ingress engine `engine` for sandbox id at address (token: its access token). Rejects when it does not listen within 10 s. */
export async function startEngineIngress(engine: 'raw' | 'node-http', id: string, address: string, token: string): Promise<EngineIngress> {
  const sha = createHash('sha256').update(token).digest('hex');
  const child: ChildProcess = spawn(process.execPath, ['-e', CHILD, engine, id, address, sha], {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { ...process.env, INGRESS_JS, DIRECTORY_JS, SHARED_JS },
  });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    child.stdin!.end();
    const t = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
  };
  const port = await new Promise<number>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`ingress engine ${engine} did not listen within 10 s: ${stderr.slice(0, 300)}`)), 10_000);
    let out = '';
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      const m = /^(\d+)\n/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(Number(m[1]));
      }
    });
    child.once('exit', (code) => {
      clearTimeout(t);
      reject(new Error(`ingress engine ${engine} exited ${code}: ${stderr.slice(0, 300)}`));
    });
  }).catch(async (err: unknown) => {
    await stop();
    throw err;
  });
  return { port, stop };
}
