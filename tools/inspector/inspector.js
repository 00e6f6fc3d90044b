// The attention inspector: draws window.ATTN_INSPECTOR_DATA (written by inspect_attention
// from the model's forward pass) into #attention-inspector. Vanilla JavaScript, no network.
//
// The data: weights[layer][head][query] holds the weights of the keys that query may see
// (0..query under the causal mask), entropy[layer][head] each head's mean entropy in nats.
// An encoder-decoder's data (kind "encoder_decoder") holds three such attentions instead,
// each with its rows and columns named: cross-attention (each written character over the
// input), the encoder's self-attention and the decoder's (see encoderDecoder below).
(function () {
  'use strict';
  var root = document.getElementById('attention-inspector');
  var data = window.ATTN_INSPECTOR_DATA;
  if (!root) return;
  if (!data) {
    root.textContent = 'The attention data (attention_data.js) did not load: ' +
      'run ./workbook inspect to write it.';
    return;
  }
  if (data.kind === 'encoder_decoder') { encoderDecoder(root, data); return; }
  var L = data.n_layer, NH = data.n_head, T = data.prompt.length;
  // Start on the most focused head (the lowest mean entropy), at the last query.
  var state = { layer: 0, head: 0, query: T - 1 };
  data.entropy.forEach(function (row, l) {
    row.forEach(function (e, h) { if (e < data.entropy[state.layer][state.head]) { state.layer = l; state.head = h; } });
  });

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function weight(l, h, i, j) {
    var row = data.weights[l][h][i];
    return j < row.length ? row[j] : null;  // null: a key the query may not see
  }
  // A character as the page shows it: spaces and newlines made visible.
  function shown(ch) { return ch === ' ' ? '\u2423' : ch === '\n' ? '\u21b5' : ch === '\t' ? '\u21e5' : ch; }
  function special(ch) { return ch === ' ' || ch === '\n' || ch === '\t'; }
  function quoted(ch) { return '\u2018' + shown(ch) + '\u2019'; }
  // White to deep blue by the square root of the weight, so that weights spread over many
  // keys still show; keys hidden by the mask are light grey.
  function colour(w) {
    if (w === null) return [238, 238, 238];
    var t = Math.sqrt(Math.max(0, Math.min(1, w)));
    return [Math.round(255 - 224 * t), Math.round(255 - 160 * t), Math.round(255 - 64 * t)];
  }

  // One head's (T, T) map, one pixel per weight, scaled up without smoothing.
  function drawMap(canvas, l, h, size, query) {
    var small = document.createElement('canvas');
    small.width = T; small.height = T;
    var sctx = small.getContext('2d');
    var img = sctx.createImageData(T, T);
    for (var i = 0; i < T; ++i) {
      for (var j = 0; j < T; ++j) {
        var c = colour(weight(l, h, i, j)), k = 4 * (i * T + j);
        img.data[k] = c[0]; img.data[k + 1] = c[1]; img.data[k + 2] = c[2]; img.data[k + 3] = 255;
      }
    }
    sctx.putImageData(img, 0, 0);
    canvas.width = size; canvas.height = size;
    var ctx = canvas.getContext('2d');
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(small, 0, 0, size, size);
    if (query !== undefined) {  // the chosen query's row
      var cell = size / T;
      ctx.strokeStyle = '#d2321e'; ctx.lineWidth = 2;
      ctx.strokeRect(1, query * cell + 1, size - 2, Math.max(cell - 2, 1));
    }
  }

  // The description of the model.
  var about = el('p', 'ai-about');
  about.textContent = 'A GPT of ' + L + ' layers \u00d7 ' + NH + ' heads (' + data.n_embd +
    ' channels, block ' + data.block_size + ', vocabulary of ' + data.vocab_size + ') after ' +
    data.step + ' training steps, ' +
    (data.corpus ? 'trained on ' + data.corpus : 'trained on a corpus its checkpoint does not name') +
    '. The prompt has ' + T + ' characters. Each head\u2019s mean entropy is beside it, in nats ' +
    '(the bar: against ' + data.max_entropy.toFixed(2) + ', the mean entropy of attention spread ' +
    'evenly over every visible key). Shading grows with the square root of a weight, so that ' +
    'small weights still show. Checkpoint: ' + data.checkpoint + '.';
  root.appendChild(about);

  var main = el('div', 'ai-main');
  root.appendChild(main);

  // The grid of small maps: one row per layer, one column per head.
  var grid = el('table', 'ai-grid');
  var head = el('tr');
  head.appendChild(el('th'));
  for (var h0 = 0; h0 < NH; ++h0) head.appendChild(el('th', null, 'head ' + (h0 + 1)));
  grid.appendChild(head);
  var cells = [];
  for (var l = 0; l < L; ++l) {
    var tr = el('tr');
    tr.appendChild(el('th', null, 'layer ' + (l + 1)));
    cells.push([]);
    for (var h = 0; h < NH; ++h) {
      var td = el('td');
      var button = el('button', 'ai-cell');
      button.type = 'button';
      button.dataset.layer = l; button.dataset.head = h;
      button.title = 'layer ' + (l + 1) + ', head ' + (h + 1);
      var canvas = el('canvas');
      drawMap(canvas, l, h, 72);
      button.appendChild(canvas);
      var e = data.entropy[l][h];
      button.appendChild(el('span', 'ai-entropy', 'H ' + e.toFixed(2) + ' nats'));
      var bar = el('span', 'ai-bar'), fill = el('span');
      fill.style.width = Math.min(100, 100 * e / data.max_entropy).toFixed(1) + '%';
      bar.appendChild(fill);
      button.appendChild(bar);
      button.addEventListener('click', selectHead.bind(null, l, h));
      td.appendChild(button);
      tr.appendChild(td);
      cells[l].push(button);
    }
    grid.appendChild(tr);
  }
  main.appendChild(grid);

  // The large map of the chosen head.
  var large = el('div', 'ai-large');
  var title = el('h3');
  var big = el('canvas', 'ai-large-map');
  var hover = el('div', 'ai-hover', '\u00a0');
  large.appendChild(title); large.appendChild(big); large.appendChild(hover);
  main.appendChild(large);
  var BIG = Math.max(T, Math.floor(448 / T) * T);
  function cellAt(event) {
    var r = big.getBoundingClientRect();
    var i = Math.floor((event.clientY - r.top) / r.height * T);
    var j = Math.floor((event.clientX - r.left) / r.width * T);
    return [Math.max(0, Math.min(T - 1, i)), Math.max(0, Math.min(T - 1, j))];
  }
  big.addEventListener('mousemove', function (event) {
    var ij = cellAt(event), w = weight(state.layer, state.head, ij[0], ij[1]);
    hover.textContent = 'query ' + quoted(data.prompt[ij[0]]) + ' (position ' + ij[0] + ') \u2192 key ' +
      quoted(data.prompt[ij[1]]) + ' (position ' + ij[1] + '): ' +
      (w === null ? 'hidden by the causal mask' : w.toFixed(4));
  });
  big.addEventListener('click', function (event) { selectQuery(cellAt(event)[0]); });

  // The prompt, one box per character: the chosen query outlined, the keys it attends to
  // shaded by their weight, the weight written under each.
  var prompt = el('div', 'ai-prompt');
  var chars = [];
  data.prompt.forEach(function (ch, i) {
    var box = el('span', 'ai-char');
    box.dataset.pos = i;
    var glyph = el('span', 'ai-glyph' + (special(ch) ? ' ai-special' : ''), shown(ch));
    box.appendChild(glyph);
    box.appendChild(el('span', 'ai-weight'));
    box.addEventListener('mouseenter', selectQuery.bind(null, i));
    box.addEventListener('click', selectQuery.bind(null, i));
    prompt.appendChild(box);
    chars.push(box);
  });
  root.appendChild(prompt);
  var readout = el('div', 'ai-readout');
  root.appendChild(readout);

  function selectHead(l, h) { state.layer = l; state.head = h; render(); }
  function selectQuery(i) { state.query = i; render(); }

  function render() {
    var l = state.layer, h = state.head, q = state.query;
    root.dataset.layer = l; root.dataset.head = h; root.dataset.query = q;
    cells.forEach(function (row, li) {
      row.forEach(function (b, hi) { b.classList.toggle('ai-selected', li === l && hi === h); });
    });
    title.textContent = 'Layer ' + (l + 1) + ', head ' + (h + 1) + ': mean entropy ' +
      data.entropy[l][h].toFixed(2) + ' nats (rows: queries, columns: keys)';
    drawMap(big, l, h, BIG, q);
    var row = data.weights[l][h][q], entropy = 0;
    chars.forEach(function (box, j) {
      var w = weight(l, h, q, j), label = box.lastChild;
      box.classList.toggle('ai-query', j === q);
      box.classList.toggle('ai-future', w === null);
      if (w === null) {
        box.style.background = ''; label.textContent = ''; box.dataset.weight = '';
        box.title = quoted(data.prompt[j]) + ' (position ' + j + '): after the query, hidden by the mask';
        return;
      }
      var c = colour(w);
      box.style.background = 'rgb(' + c.join(',') + ')';
      box.style.color = w > 0.3 ? '#fff' : '';
      label.style.color = w > 0.3 ? '#fff' : '';
      label.textContent = w >= 0.005 ? w.toFixed(2) : '';
      box.dataset.weight = w.toFixed(4);
      box.title = quoted(data.prompt[j]) + ' (position ' + j + '): weight ' + w.toFixed(4);
      if (w > 0) entropy -= w * Math.log(w);
    });
    var order = row.map(function (w, j) { return [w, j]; }).sort(function (a, b) { return b[0] - a[0]; });
    var top = order.slice(0, 5).map(function (p) {
      return quoted(data.prompt[p[1]]) + ' at ' + p[1] + ': ' + p[0].toFixed(2);
    });
    readout.textContent = 'Query ' + quoted(data.prompt[q]) + ' (position ' + q + ') in layer ' +
      (l + 1) + ', head ' + (h + 1) + ' attends most to ' + top.join('; ') +
      '. Entropy of this row: ' + entropy.toFixed(2) + ' nats (at most ln ' + row.length + ' = ' +
      Math.log(row.length).toFixed(2) + ').';
  }
  render();
  // An encoder-decoder (lesson 17): the three attentions of one pass, chosen by buttons;
  // each map is T_q x T_k, rows the queries and columns the keys, which need not be square.
  function encoderDecoder(root, data) {
    var texts = { source: data.source, written: data.written, decoder_input: data.decoder_input };
    var rowNames = { source: 'input character', written: 'written character', decoder_input: 'decoder input' };
    var state = { kind: 0, layer: 0, head: 0, query: 0 };
    function att() { return data.attentions[state.kind]; }
    function rowsOf(a) { return texts[a.rows]; }
    function colsOf(a) { return texts[a.cols]; }
    function el(tag, cls, text) {
      var e = document.createElement(tag);
      if (cls) e.className = cls;
      if (text !== undefined) e.textContent = text;
      return e;
    }
    function shown(ch) { return ch === ' ' ? '\u2423' : ch; }
    function quoted(ch) { return '\u2018' + shown(ch) + '\u2019'; }
    function weight(a, l, h, i, j) {
      var row = a.weights[l][h][i];
      return j < row.length ? row[j] : null;  // null: hidden by the causal mask
    }
    function colour(w) {
      if (w === null) return [238, 238, 238];
      var t = Math.sqrt(Math.max(0, Math.min(1, w)));
      return [Math.round(255 - 224 * t), Math.round(255 - 160 * t), Math.round(255 - 64 * t)];
    }
    // One head's (T_q, T_k) map, `cell` pixels a weight; labels around it when `labelled`.
    function drawMap(canvas, a, l, h, cell, labelled, query) {
      var rows = rowsOf(a), cols = colsOf(a), Tq = rows.length, Tk = cols.length;
      var left = labelled ? 44 : 0, top = labelled ? 18 : 0;
      canvas.width = left + Tk * cell; canvas.height = top + Tq * cell;
      var ctx = canvas.getContext('2d');
      ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, canvas.width, canvas.height);
      for (var i = 0; i < Tq; ++i) {
        for (var j = 0; j < Tk; ++j) {
          var c = colour(weight(a, l, h, i, j));
          ctx.fillStyle = 'rgb(' + c.join(',') + ')';
          ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
        }
      }
      if (labelled) {
        ctx.fillStyle = '#333'; ctx.font = Math.min(13, cell) + 'px monospace'; ctx.textAlign = 'center';
        ctx.textBaseline = 'bottom';
        cols.forEach(function (ch, j) { ctx.fillText(shown(ch), left + (j + 0.5) * cell, top - 2); });
        ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
        rows.forEach(function (ch, i) { ctx.fillText(shown(ch), left - 4, top + (i + 0.5) * cell); });
      }
      if (query !== undefined) {
        ctx.strokeStyle = '#d2321e'; ctx.lineWidth = 2;
        ctx.strokeRect(left + 1, top + query * cell + 1, Tk * cell - 2, Math.max(cell - 2, 1));
      }
      return { left: left, top: top, cell: cell };
    }

    var about = el('p', 'ai-about');
    about.textContent = 'An encoder\u2013decoder of ' + data.n_encoder_layer + ' encoder and ' +
      data.n_decoder_layer + ' decoder layers \u00d7 ' + data.n_head + ' heads (' + data.n_embd +
      ' channels, vocabulary of ' + data.vocab_size + ') after ' + data.step + ' training steps. ' +
      'Its input is \u201c' + data.source.join('') + '\u201d; it wrote \u201c' + data.answer +
      '\u201d, then read its answer back, and these are the weights of that pass. ' +
      'Shading grows with the square root of a weight. Checkpoint: ' + data.checkpoint + '.';
    root.appendChild(about);
    var kinds = el('div', 'ai-kinds');
    var kindButtons = data.attentions.map(function (a, k) {
      var b = el('button', 'ai-kind', a.name);
      b.type = 'button';
      b.addEventListener('click', function () { state.kind = k; state.query = 0; build(); });
      kinds.appendChild(b);
      return b;
    });
    root.appendChild(kinds);
    var main = el('div', 'ai-main');
    root.appendChild(main);
    var rowsBox = el('div', 'ai-prompt'), colsBox = el('div', 'ai-prompt');
    var rowsTitle = el('div', 'ai-hover'), colsTitle = el('div', 'ai-hover');
    root.appendChild(rowsTitle); root.appendChild(rowsBox);
    root.appendChild(colsTitle); root.appendChild(colsBox);
    var readout = el('div', 'ai-readout');
    root.appendChild(readout);
    var cells = [], big, title, hover, layout, rowChars = [], colChars = [];

    // The grid, the large map and the two texts for the chosen attention.
    function build() {
      var a = att(), L = a.weights.length, NH = a.weights[0].length;
      var rows = rowsOf(a), cols = colsOf(a);
      // start on the most focused head (the lowest mean entropy), as the GPT's page does
      state.layer = 0; state.head = 0;
      a.entropy.forEach(function (row, l) {
        row.forEach(function (e, h) { if (e < a.entropy[state.layer][state.head]) { state.layer = l; state.head = h; } });
      });
      kindButtons.forEach(function (b, k) { b.classList.toggle('ai-selected', k === state.kind); });
      main.textContent = ''; cells = [];
      var grid = el('table', 'ai-grid'), head = el('tr');
      head.appendChild(el('th'));
      for (var h0 = 0; h0 < NH; ++h0) head.appendChild(el('th', null, 'head ' + (h0 + 1)));
      grid.appendChild(head);
      var small = Math.max(1, Math.floor(96 / Math.max(rows.length, cols.length)));
      for (var l = 0; l < L; ++l) {
        var tr = el('tr');
        tr.appendChild(el('th', null, 'layer ' + (l + 1)));
        cells.push([]);
        for (var h = 0; h < NH; ++h) {
          var td = el('td'), button = el('button', 'ai-cell'), canvas = el('canvas');
          button.type = 'button';
          button.title = a.name + ', layer ' + (l + 1) + ', head ' + (h + 1);
          drawMap(canvas, a, l, h, small, false);
          canvas.style.width = canvas.width + 'px'; canvas.style.height = canvas.height + 'px';
          button.appendChild(canvas);
          button.appendChild(el('span', 'ai-entropy', 'H ' + a.entropy[l][h].toFixed(2) + ' nats'));
          button.addEventListener('click', (function (l, h) {
            return function () { state.layer = l; state.head = h; render(); };
          })(l, h));
          td.appendChild(button); tr.appendChild(td); cells[l].push(button);
        }
        grid.appendChild(tr);
      }
      main.appendChild(grid);
      var large = el('div', 'ai-large');
      title = el('h3'); big = el('canvas', 'ai-large-map'); hover = el('div', 'ai-hover', '\u00a0');
      large.appendChild(title); large.appendChild(big); large.appendChild(hover);
      main.appendChild(large);
      big.addEventListener('mousemove', function (event) {
        var ij = cellAt(event);
        if (!ij) { hover.textContent = '\u00a0'; return; }
        var w = weight(att(), state.layer, state.head, ij[0], ij[1]);
        hover.textContent = rowNames[att().rows] + ' ' + quoted(rowsOf(att())[ij[0]]) + ' (' + ij[0] +
          ') \u2192 ' + rowNames[att().cols] + ' ' + quoted(colsOf(att())[ij[1]]) + ' (' + ij[1] + '): ' +
          (w === null ? 'hidden by the causal mask' : w.toFixed(4));
      });
      big.addEventListener('click', function (event) { var ij = cellAt(event); if (ij) selectQuery(ij[0]); });
      rowsTitle.textContent = 'Queries (rows), ' + rowNames[a.rows] + 's: hover over or click one';
      colsTitle.textContent = 'Keys (columns), ' + rowNames[a.cols] + 's, shaded by the chosen query\u2019s weights';
      rowChars = fill(rowsBox, rows, true);
      colChars = fill(colsBox, cols, false);
      render();
    }
    function fill(box, chars, selectable) {
      box.textContent = '';
      return chars.map(function (ch, i) {
        var c = el('span', 'ai-char');
        c.appendChild(el('span', 'ai-glyph' + (ch === ' ' ? ' ai-special' : ''), shown(ch)));
        c.appendChild(el('span', 'ai-weight'));
        if (selectable) {
          c.addEventListener('mouseenter', selectQuery.bind(null, i));
          c.addEventListener('click', selectQuery.bind(null, i));
        }
        box.appendChild(c);
        return c;
      });
    }
    function cellAt(event) {
      var r = big.getBoundingClientRect(), scale = big.width / r.width;
      var x = (event.clientX - r.left) * scale - layout.left, y = (event.clientY - r.top) * scale - layout.top;
      if (x < 0 || y < 0) return null;
      var i = Math.floor(y / layout.cell), j = Math.floor(x / layout.cell);
      if (i >= rowsOf(att()).length || j >= colsOf(att()).length) return null;
      return [i, j];
    }
    function selectQuery(i) { state.query = i; render(); }
    function render() {
      var a = att(), l = state.layer, h = state.head, q = state.query;
      var rows = rowsOf(a), cols = colsOf(a);
      root.dataset.kind = state.kind; root.dataset.layer = l; root.dataset.head = h; root.dataset.query = q;
      cells.forEach(function (row, li) {
        row.forEach(function (b, hi) { b.classList.toggle('ai-selected', li === l && hi === h); });
      });
      title.textContent = a.name + ', layer ' + (l + 1) + ', head ' + (h + 1) + ': mean entropy ' +
        a.entropy[l][h].toFixed(2) + ' nats (rows: ' + rowNames[a.rows] + 's, columns: ' + rowNames[a.cols] + 's)';
      var cell = Math.max(8, Math.min(22, Math.floor(560 / cols.length)));
      layout = drawMap(big, a, l, h, cell, true, q);
      rowChars.forEach(function (c, i) { c.classList.toggle('ai-query', i === q); });
      var order = [];
      colChars.forEach(function (c, j) {
        var w = weight(a, l, h, q, j), label = c.lastChild;
        c.classList.toggle('ai-future', w === null);
        if (w === null) { c.style.background = ''; label.textContent = ''; c.dataset.weight = ''; return; }
        var col = colour(w);
        c.style.background = 'rgb(' + col.join(',') + ')';
        c.style.color = w > 0.3 ? '#fff' : ''; label.style.color = w > 0.3 ? '#fff' : '';
        label.textContent = w >= 0.005 ? w.toFixed(2) : '';
        c.dataset.weight = w.toFixed(4);
        order.push([w, j]);
      });
      order.sort(function (x, y) { return y[0] - x[0]; });
      readout.textContent = rowNames[a.rows].charAt(0).toUpperCase() + rowNames[a.rows].slice(1) + ' ' +
        quoted(rows[q]) + ' (' + q + ') in layer ' + (l + 1) + ', head ' + (h + 1) + ' attends most to ' +
        order.slice(0, 5).map(function (p) { return quoted(cols[p[1]]) + ' at ' + p[1] + ': ' + p[0].toFixed(2); }).join('; ') + '.';
    }
    build();
  }
})();
