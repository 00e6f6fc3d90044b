// The serving page: sends completions to a running serve_gpt (./workbook serve), shows the
// streamed characters as they come, and draws the server's KV cache: one square per block
// of its pool, coloured by the request whose block table holds it (grey: free). Nothing is
// sent until a button is pressed. The server's address: ?server=URL, else 127.0.0.1:8000;
// the server must let the page's origin in (serve_gpt --allow-origin null for a page opened
// from a file).
(function () {
  'use strict';
  var root = document.getElementById('serving-playground');
  if (!root) return;
  var params = new URLSearchParams(window.location.search);
  var colours = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf'];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }
  var server = el('input', {type: 'text', id: 'sp-server', value: params.get('server') || 'http://127.0.0.1:8000'});
  var prompt = el('textarea', {id: 'sp-prompt'});
  prompt.value = 'ROMEO:';
  var maxTokens = el('input', {type: 'number', id: 'sp-max', value: '120', min: '1'});
  var temperature = el('input', {type: 'number', id: 'sp-temperature', value: '0.8', step: '0.1', min: '0', max: '2'});
  var send = el('button', {id: 'sp-send'}, 'send');
  var sendFour = el('button', {id: 'sp-send4'}, 'send four at once');
  var status = el('span', {id: 'sp-status', 'class': 'sp-status'}, 'start a server with ./workbook serve --allow-origin null, then send');
  var texts = el('div', {'class': 'sp-texts', id: 'sp-texts'});
  var pool = el('div', {'class': 'sp-pool', id: 'sp-pool'});
  var caption = el('div', {'class': 'sp-pool-caption', id: 'sp-pool-caption'}, 'the pool appears when a request runs');

  var row1 = el('div', {'class': 'sp-row'});
  row1.append(el('label', {}, 'server '), server);
  var row2 = el('div', {'class': 'sp-row'});
  row2.append(el('label', {}, 'max_tokens '), maxTokens, el('label', {}, 'temperature '), temperature, send, sendFour, status);
  root.append(row1, prompt, row2, texts, caption, pool);

  var running = 0, requestColour = {}, nextColour = 0, polling = null;

  function setStatus(text, error) {
    status.textContent = text;
    status.className = 'sp-status' + (error ? ' sp-error' : '');
  }

  function colourOf(request) {
    if (!(request in requestColour)) requestColour[request] = colours[nextColour++ % colours.length];
    return requestColour[request];
  }

  function drawPool(state) {
    var owner = {};
    state.sequences.forEach(function (s) { s.table.forEach(function (b) { owner[b] = s.request; }); });
    while (pool.children.length < state.num_blocks) pool.append(el('div', {'class': 'sp-block'}));
    for (var b = 0; b < state.num_blocks; ++b) {
      var cell = pool.children[b];
      var used = b in owner;
      cell.style.background = used ? colourOf(owner[b]) : '';
      cell.className = 'sp-block' + (used ? ' sp-used' : '');
      cell.title = used ? 'block ' + b + ': ' + owner[b] : 'block ' + b + ': free';
    }
    caption.textContent = (state.num_blocks - state.free) + ' of ' + state.num_blocks + ' blocks of ' +
      state.block_tokens + ' positions in use by ' + state.sequences.length + ' sequence' +
      (state.sequences.length === 1 ? '' : 's') + ', ' + state.waiting + ' waiting';
  }

  function poll() {
    return fetch(server.value + '/v1/blocks').then(function (r) { return r.json(); })
      .then(drawPool).catch(function () {});
  }

  function complete(seed) {
    var box = el('pre', {'class': 'sp-text'});
    texts.append(box);
    running += 1;
    if (!polling) polling = window.setInterval(poll, 100);
    var body = {prompt: prompt.value, max_tokens: Number(maxTokens.value),
                temperature: Number(temperature.value), seed: seed, stream: true};
    return fetch(server.value + '/v1/completions', {
      method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)
    }).then(function (response) {
      if (!response.ok) {
        return response.json().then(function (e) { throw new Error(e.error ? e.error.message : response.status); });
      }
      var reader = response.body.getReader(), decoder = new TextDecoder(), pending = '';
      box.textContent = prompt.value;
      function read() {
        return reader.read().then(function (chunk) {
          if (chunk.done) return;
          pending += decoder.decode(chunk.value, {stream: true});
          var events = pending.split('\n\n');
          pending = events.pop();
          events.forEach(function (event) {
            if (event.indexOf('data: ') !== 0) return;
            var data = event.slice(6);
            if (data === '[DONE]') { box.className = 'sp-text sp-done'; return; }
            var parsed = JSON.parse(data);
            box.style.setProperty('--sp-colour', colourOf(parsed.id));
            box.textContent += parsed.choices[0].text;
          });
          return read();
        });
      }
      return read();
    }).catch(function (e) {
      box.remove();
      setStatus('no answer from ' + server.value + ' (' + e.message + '): is ./workbook serve --allow-origin null running?', true);
    }).then(function () {
      running -= 1;
      if (running === 0) {
        window.clearInterval(polling);
        polling = null;
        poll().then(function () { if (status.className.indexOf('sp-error') < 0) setStatus('done'); });
      }
    });
  }

  function start(n) {
    texts.textContent = '';
    setStatus('streaming…');
    for (var i = 0; i < n; ++i) complete(1 + i + Math.floor(Math.random() * 1000));
  }
  send.addEventListener('click', function () { start(1); });
  sendFour.addEventListener('click', function () { start(4); });
})();
