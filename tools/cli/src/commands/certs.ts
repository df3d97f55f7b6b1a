/**
 * `sandnode certs init [--dir D] [--force]`: a development CA and two pairs it signs, for the
 * server's mutual-TLS TCP listener (issue 10 §4): `server.pem`/`server.key` (SAN: localhost,
 * 127.0.0.1 and this machine's hostname; server keys tlsCert/tlsKey, tlsCa = ca.pem) and
 * `client.pem`/`client.key` (CLI: --tls-ca ca.pem --tls-cert client.pem --tls-key client.key).
 * Made with openssl (EC P-256); keys are 0600. Files already there are kept unless --force
 * (exit 1 naming them). For production, use certificates of your own CA.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Command } from 'commander';
import { action, print } from '../output';

/** Days the CA and the pairs are valid. */
const CA_DAYS = 3650;
const PAIR_DAYS = 825;
const FILES = ['ca.pem', 'ca.key', 'server.pem', 'server.key', 'client.pem', 'client.key'];

function openssl(args: string[], cwd: string): void {
  try {
    execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (err) {
    const e = err as { code?: string; stderr?: Buffer };
    if (e.code === 'ENOENT') throw new Error('openssl is not installed (apt-get install openssl, or run deploy/host-setup.sh)', { cause: err });
    throw new Error(`openssl ${args[0]} failed: ${e.stderr?.toString().trim() ?? String(err)}`, { cause: err });
  }
}

/** makePair makes name.key and name.pem signed by the CA in dir, with the extensions ext. */
function makePair(dir: string, name: string, cn: string, ext: string, days: number): void {
  openssl(['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`], dir);
  writeFileSync(path.join(dir, `${name}.ext`), ext);
  openssl(['x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', `${name}.pem`, '-days', String(days), '-extfile', `${name}.ext`], dir);
  for (const f of [`${name}.csr`, `${name}.ext`]) rmSync(path.join(dir, f), { force: true });
  chmodSync(path.join(dir, `${name}.key`), 0o600);
}

/** initCerts makes the CA and the server and client pairs in dir (see the file header); returns the file paths. Errors: an Error naming files already there (without force), or openssl's. */
export function initCerts(dir: string, force = false, hostname = os.hostname()): Record<string, string> {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const there = FILES.filter((f) => existsSync(path.join(dir, f)));
  if (there.length && !force) throw new Error(`${dir} already holds ${there.join(', ')}: kept (use --force to make new ones)`);
  openssl(
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      'ca.key',
      '-out',
      'ca.pem',
      '-days',
      String(CA_DAYS),
      '-subj',
      '/CN=sandnode development CA',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ],
    dir,
  );
  chmodSync(path.join(dir, 'ca.key'), 0o600);
  const san = [...new Set(['DNS:localhost', 'IP:127.0.0.1', ...(hostname && /^[A-Za-z0-9.-]+$/.test(hostname) ? [`DNS:${hostname}`] : [])])].join(',');
  makePair(dir, 'server', 'sandnode-server', `subjectAltName=${san}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n`, PAIR_DAYS);
  makePair(dir, 'client', 'sandnode-client', 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n', PAIR_DAYS);
  rmSync(path.join(dir, 'ca.srl'), { force: true });
  return Object.fromEntries(FILES.map((f) => [f, path.join(dir, f)]));
}

/** registerCertsCommands adds `certs init` to program. */
export function registerCertsCommands(program: Command): void {
  program
    .command('certs')
    .description('TLS certificates for the TCP API')
    .command('init')
    .description('make a development CA, a server pair and a client pair (openssl)')
    .option('--dir <dir>', 'where to write them', './.sandnode/certs')
    .option('--force', 'replace files already there')
    .option('--json', 'print JSON')
    .action(
      action(async (o: { dir: string; force?: boolean; json?: boolean }) => {
        const dir = path.resolve(o.dir);
        const files = initCerts(dir, !!o.force);
        print(!!o.json, { dir, files }, () =>
          [
            `made a development CA and server/client pairs in ${dir}`,
            `server: tlsCa=${files['ca.pem']} tlsCert=${files['server.pem']} tlsKey=${files['server.key']}`,
            `client: --tls-ca ${files['ca.pem']} --tls-cert ${files['client.pem']} --tls-key ${files['client.key']}`,
          ].join('\n'),
        );
      }),
    );
}
