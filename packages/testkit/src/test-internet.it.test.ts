import { execFileSync, spawn } from 'node:child_process';
import dgram from 'node:dgram';
import https from 'node:https';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import path from 'node:path';
import { built, describeWith, PARTS } from './prereq';
import { startTestInternet } from './test-internet';
import { claimTestSubnet, randomTag } from './test-subnet';

jest.setTimeout(60_000);

const netnsList = () => execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
const links = () => execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' });

// The killed claimer runs the built module (a plain node process).
const DIST = path.join(__dirname, '..', 'dist', 'test-subnet.js');

describeWith('startTestInternet', [PARTS.root, built('@sandnode/testkit', 'dist/test-subnet.js')], () => {
  it('serves HTTP, HTTPS with SNI, DNS and a TCP echo, and stop() removes the netns, the veth and the claim', async () => {
    const ti = await startTestInternet({ records: { 'meta.test': '169.254.169.254' } });
    try {
      const http = execFileSync('curl', ['-sS', '-m', '5', '-H', 'Host: allowed.test', `http://${ti.address}/x`], { encoding: 'utf8' });
      expect(JSON.parse(http)).toMatchObject({ method: 'GET', path: '/x', host: 'allowed.test', remote: ti.hostAddress });
      // verified against the returned certificate for the name asked (SAN), over SNI
      const body = await new Promise<string>((resolve, reject) => {
        https
          .get({ host: ti.address, port: ti.ports.https, path: '/y', servername: 'denied.test', headers: { host: 'denied.test' }, ca: ti.certPem }, (res) => {
            let b = '';
            res.on('data', (d: Buffer) => (b += d.toString()));
            res.on('end', () => resolve(b));
          })
          .on('error', reject);
      });
      expect(JSON.parse(body)).toMatchObject({ sni: 'denied.test', path: '/y' });

      const udp = dgram.createSocket('udp4');
      const answer = new Promise<dnsPacket.DecodedPacket>((resolve) => udp.once('message', (m) => resolve(dnsPacket.decode(m))));
      udp.send(dnsPacket.encode({ type: 'query', id: 5, questions: [{ type: 'A', name: 'meta.test' }] }), ti.dns.port, ti.dns.address);
      expect((await answer).answers).toMatchObject([{ type: 'A', data: '169.254.169.254' }]);
      udp.close();

      const echo = net.connect(ti.ports.echo, ti.address);
      const back = new Promise<string>((resolve) => echo.once('data', (d: Buffer) => resolve(d.toString())));
      echo.write('ping');
      expect(await back).toBe('ping');
      echo.destroy();
      expect(netnsList()).toContain(ti.netns);
    } finally {
      await ti.stop();
    }
    expect(netnsList()).not.toContain(ti.netns);
    expect(links()).not.toContain(ti.hostIface);
    const again = claimTestSubnet(ti.cidr, 30); // the /30 is free again
    again.release();
  });

  it('a claim whose process was killed is taken over and what it owned is removed', async () => {
    const probe = claimTestSubnet('198.18.0.0/15', 30);
    const cidr = probe.cidr;
    probe.release();
    const ns = `snts${randomTag(6)}`;
    // A child claims the subnet, makes a netns it records, and is SIGKILLed without releasing.
    const src = `const { claimTestSubnet } = require(${JSON.stringify(DIST)});
      const s = claimTestSubnet(${JSON.stringify(cidr)}, 30); require('node:child_process').execFileSync('ip', ['netns', 'add', '${ns}']);
      s.own('netns', '${ns}'); process.stdout.write('ready\\n'); setInterval(() => {}, 1000);`;
    const child = spawn(process.execPath, ['-e', src], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => child.stdout!.on('data', (d: Buffer) => d.toString().includes('ready') && resolve()));
    expect(() => claimTestSubnet(cidr, 30)).toThrow(/no free/); // held by a live process
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    expect(netnsList()).toContain(ns);
    const taken = claimTestSubnet(cidr, 30);
    try {
      expect(netnsList()).not.toContain(ns);
    } finally {
      taken.release();
      if (netnsList().includes(ns)) execFileSync('ip', ['netns', 'del', ns]);
    }
  });
});
