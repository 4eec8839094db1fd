// record_proxy.mjs - records what a client sends to `deltafin serve`: a
// reverse proxy on 127.0.0.1 that forwards every request unchanged to the
// server and streams the reply back, writing each POST as a JSON file
// {method, url, headers, body, status} (body parsed when it is JSON) into DIR,
// numbered in arrival order.  For tests/agents/run_agent_tests.sh and for
// recording a client's requests by hand:
//   node record_proxy.mjs PORT UPSTREAM_PORT DIR
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';

const [port, upstream, dir] = [Number(process.argv[2]), Number(process.argv[3]), process.argv[4]];
fs.mkdirSync(dir, { recursive: true });
let n = 0;

const server = http.createServer((req, res) => {
  const parts = [];
  req.on('data', (d) => parts.push(d));
  req.on('end', () => {
    const body = Buffer.concat(parts);
    const seq = ++n;
    const rec = { method: req.method, url: req.url, headers: req.headers, status: null };
    try { rec.body = body.length ? JSON.parse(body.toString('utf8')) : null; } catch { rec.body_text = body.toString('utf8'); }
    const file = path.join(dir, `${String(seq).padStart(3, '0')}-${req.method}.json`);
    const save = () => { if (req.method !== 'GET') fs.writeFileSync(file, JSON.stringify(rec, null, 1)); };
    const up = http.request({ host: '127.0.0.1', port: upstream, path: req.url, method: req.method, headers: req.headers },
      (r) => {
        rec.status = r.statusCode;
        save();
        res.writeHead(r.statusCode, r.headers);
        r.pipe(res);
      });
    up.on('error', (e) => { rec.status = 502; rec.error = String(e); save(); res.writeHead(502); res.end(); });
    res.on('close', () => up.destroy());
    up.end(body);
  });
});
server.listen(port, '127.0.0.1');
