// fault_proxy.mjs - a fault-injecting HTTP proxy in front of the test mirror
// (nginx), for tests/setup/run_setup_tests.sh.  Node's own http module; no
// packages.
//   node fault_proxy.mjs PORT UPSTREAM_PORT
// Environment:
//   FAULTS     "N:kind,..." : the Nth file request (GET .../resolve/..., from 1)
//              gets kind: drop (half the body, then the connection is cut),
//              503 (Retry-After: 1), 429, short (Content-Length kept, the body
//              ends early), flip (one byte of the body changed), slow (the body
//              in 1 KiB pieces 20 ms apart)
//   FLIP_FILE  a path suffix whose every response has one byte changed
//   FLIP_AFTER FLIP_FILE spares that file's first N responses (a shard's two
//              header requests: only its data is changed)
//   FLIP_VARY  1: FLIP_FILE's responses are changed each at another byte (no two
//              of them alike); otherwise the same byte of each (alike when the
//              same range is asked twice)
//   THROTTLE_MS  a pause before each file response
//   PAGE       tree listings split into pages of this many entries (Link: rel="next")
// GET /__stats answers {"file_requests":N,"file_bytes":B} (body bytes sent for files).
import http from 'node:http';

const [port, upstream] = process.argv.slice(2).map(Number);
const faults = new Map((process.env.FAULTS ?? '').split(',').filter(Boolean).map((f) => {
  const [n, kind] = f.split(':');
  return [Number(n), kind];
}));
const flipFile = process.env.FLIP_FILE ?? '';
const flipAfter = Number(process.env.FLIP_AFTER ?? 0);
const flipVary = process.env.FLIP_VARY === '1';
const perFile = new Map();
const throttle = Number(process.env.THROTTLE_MS ?? 0);
const page = Number(process.env.PAGE ?? 0);
let fileRequests = 0, fileBytes = 0;

function fetchUpstream(req, cb) {
  const u = http.request({ host: '127.0.0.1', port: upstream, path: req.url, method: req.method, headers: req.headers },
    (r) => {
      const parts = [];
      r.on('data', (d) => parts.push(d));
      r.on('end', () => cb(r, Buffer.concat(parts)));
    });
  u.on('error', () => cb(null, null));
  u.end();
}

const server = http.createServer((req, res) => {
  if (req.url === '/__stats') {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ file_requests: fileRequests, file_bytes: fileBytes }));
    return;
  }
  const isFile = req.url.includes('/resolve/');
  const n = isFile ? ++fileRequests : 0;
  const kind = isFile ? faults.get(n) : undefined;
  if (kind === '503' || kind === '429') {
    res.writeHead(Number(kind), { 'Retry-After': '1', 'Content-Type': 'text/plain' });
    res.end('try later');
    return;
  }
  fetchUpstream(req, (r, body) => {
    if (!r) { res.writeHead(502); res.end(); return; }
    const headers = { ...r.headers };
    delete headers['transfer-encoding'];
    delete headers.connection;
    const url = new URL(req.url, 'http://x');
    if (page && url.pathname.includes('/tree/') && r.statusCode === 200) {
      const all = JSON.parse(body.toString());
      const at = Number(url.searchParams.get('cursor') ?? 0);
      const out = Buffer.from(JSON.stringify(all.slice(at, at + page)));
      if (at + page < all.length) {
        url.searchParams.set('cursor', String(at + page));
        headers.link = `<http://127.0.0.1:${port}${url.pathname}${url.search}>; rel="next"`;
      }
      headers['content-length'] = String(out.length);
      res.writeHead(200, headers);
      res.end(out);
      return;
    }
    let flipThis = false, at = body ? body.length >> 1 : 0;
    if (isFile && flipFile && url.pathname.endsWith(flipFile)) {
      const seen = (perFile.get(url.pathname) ?? 0) + 1;
      perFile.set(url.pathname, seen);
      flipThis = seen > flipAfter;
      if (flipVary && body.length) at = (at + seen) % body.length;
    }
    if (isFile && (kind === 'flip' || flipThis) && body.length) {
      body = Buffer.from(body);
      body[at] ^= 0x5a;
    }
    const send = () => {
      res.writeHead(r.statusCode, headers);
      if (!isFile) { res.end(body); return; }
      if (kind === 'drop') {
        const half = body.subarray(0, body.length >> 1);
        fileBytes += half.length;
        res.write(half, () => res.socket.destroy());
        return;
      }
      if (kind === 'short') {
        const part = body.subarray(0, Math.max(0, body.length - 100));
        fileBytes += part.length;
        res.write(part, () => res.socket.destroy());
        return;
      }
      if (kind === 'slow') {
        let at = 0;
        const tick = () => {
          const piece = body.subarray(at, at + 1024);
          at += piece.length;
          fileBytes += piece.length;
          if (at >= body.length) { res.end(piece); return; }
          res.write(piece);
          setTimeout(tick, 20);
        };
        tick();
        return;
      }
      fileBytes += body.length;
      res.end(body);
    };
    if (throttle && isFile) setTimeout(send, throttle);
    else send();
  });
});
server.keepAliveTimeout = 30000;
server.listen(port, '127.0.0.1');
