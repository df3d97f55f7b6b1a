/**
 * `sandnode certs init [--dir D] [--force] [--san IP:A|DNS:N ...]`: a development CA and two
 * pairs it signs, for the server's mutual-TLS TCP listener (issue 10 §4): `server.pem`/`server.key`
 * (SAN: localhost, 127.0.0.1, this machine's hostname and each --san; server keys
 * tlsCert/tlsKey, tlsCa = ca.pem) and
 * `client.pem`/`client.key` (CLI: --tls-ca ca.pem --tls-cert client.pem --tls-key client.key).
 * Made with openssl (EC P-256); keys are 0600. Files already there are kept unless --force
 * (exit 1 naming them). For production, use certificates of your own CA.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Command } from 'commander';
import { action, print, UsageError } from '../output';

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

/**
 * parseSan reads one --san value as a subjectAltName entry: `IP:a.b.c.d` / `IP:v6`, `DNS:name`,
 * or a bare address or name (taken as IP or DNS by its form). Throws UsageError for anything
 * else: the value goes into openssl's extension file, so a comma, newline or other byte outside
 * a host name never reaches it.
 */
export function parseSan(v: string): string {
  const m = /^(IP|DNS):(.*)$/i.exec(v.trim());
  const kind = m ? m[1]!.toUpperCase() : undefined;
  const value = m ? m[2]! : v.trim();
  if ((kind === undefined || kind === 'IP') && net.isIP(value)) return `IP:${value}`;
  if (kind === 'IP') throw new UsageError(`--san ${v}: ${JSON.stringify(value)} is not an IPv4 or IPv6 address`);
  if (/^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$/.test(value) && value.length <= 253) return `DNS:${value}`;
  throw new UsageError(`--san ${v}: give IP:ADDRESS or DNS:NAME (a host name: letters, digits, '-' and '.')`);
}

/**
 * initCerts makes the CA and the server and client pairs in dir (see the file header); san adds
 * names to the server certificate (parseSan's form: what a remote client dials, e.g. IP:192.0.2.2).
 * Returns the file paths. Errors: an Error naming files already there (without force), UsageError
 * for a bad san, or openssl's.
 */
export function initCerts(dir: string, force = false, hostname = os.hostname(), san: string[] = []): Record<string, string> {
  const extra = san.map(parseSan);
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
  const names = [...new Set(['DNS:localhost', 'IP:127.0.0.1', ...(hostname && /^[A-Za-z0-9.-]+$/.test(hostname) ? [`DNS:${hostname}`] : []), ...extra])].join(',');
  makePair(dir, 'server', 'sandnode-server', `subjectAltName=${names}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n`, PAIR_DAYS);
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
    .option(
      '--san <name>',
      'another name of the server certificate, repeatable: IP:ADDRESS or DNS:NAME (what remote clients dial; localhost, 127.0.0.1 and the hostname are always in)',
      (v: string, acc: string[]) => [...acc, v],
      [] as string[],
    )
    .option('--json', 'print JSON')
    .action(
      action(async (o: { dir: string; force?: boolean; san: string[]; json?: boolean }) => {
        const dir = path.resolve(o.dir);
        const files = initCerts(dir, !!o.force, os.hostname(), o.san);
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
