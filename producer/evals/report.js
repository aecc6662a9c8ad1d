(function(){
'use strict';
var data=JSON.parse(document.getElementById('eval-data').textContent);
var V=data.variants,T=data.strings, body=document.getElementById('case-rows'), count=document.getElementById('case-count');
var search=document.getElementById('case-filter'), which=document.getElementById('case-which');
function S(i){return i===null||i===undefined?'':T[i];}
var sortKey='i', sortDir=1, open={};
function el(tag,attrs,text){var e=document.createElement(tag);if(attrs){for(var k in attrs){e.setAttribute(k,attrs[k]);}}
 if(text!==undefined&&text!==null){e.textContent=String(text);}return e;}
function passes(c,v){var n=0,t=0;c.runs.forEach(function(r){if(r.v===v){t++;if(r.ok){n++;}}});return [n,t];}
function status(c){var all=true,none=true;c.runs.forEach(function(r){if(r.ok){none=false;}else{all=false;}});
 return all?'pass':(none?'fail':'mixed');}
function differs(c){var s=V.map(function(_,v){var p=passes(c,v);return p[1]?p[0]/p[1]:-1;});
 return s.some(function(x){return x!==s[0];});}
function key(c){if(sortKey==='i'){return c.i;}if(sortKey==='id'){return c.id;}if(sortKey==='status'){return status(c);}
 if(sortKey.charAt(0)==='v'){var p=passes(c,+sortKey.slice(1));return p[1]?p[0]/p[1]:-1;}
 if(sortKey==='lat'){return c.runs.reduce(function(a,r){return Math.max(a,r.lat);},0);}return c.i;}
function visible(c){var q=search.value.trim().toLowerCase(),w=which.value;
 if(q&&(c.id+' '+c.input+' '+c.expected+' '+c.runs.map(function(r){return r.a||'';}).join(' ')).toLowerCase().indexOf(q)<0){return false;}
 if(w==='failing'){return status(c)!=='pass';}if(w==='passing'){return status(c)==='pass';}
 if(w==='differ'){return differs(c);}if(w==='errors'){return c.runs.some(function(r){return r.ek;});}return true;}
function drill(c){var td=el('td',{colspan:String(V.length+3)});
 td.appendChild(el('div',{'class':'k'},'input'));td.appendChild(el('pre',null,c.input));
 td.appendChild(el('div',{'class':'k'},'expected'));td.appendChild(el('pre',null,c.expected));
 var side=el('div',{'class':'side'});
 c.runs.slice().sort(function(a,b){return a.v-b.v||a.r-b.r;}).forEach(function(r){
  var box=el('div',{'class':'run'});box.appendChild(el('h4',null,V[r.v]+(r.r?' #'+r.r:'')+' \u2014 '+(r.ok?'pass':'fail')+' ('+r.st+')'));
  box.appendChild(el('div',{'class':'k'},'answer'));box.appendChild(el('pre',null,r.a===null?'(none)':r.a));
  if(r.e){box.appendChild(el('div',{'class':'k'},'error ('+r.ek+')'));box.appendChild(el('pre',null,r.e));}
  var ul=el('ul');r.sc.forEach(function(s){ul.appendChild(el('li',null,S(s[0])+': '+s[1]+(s[2]?' \u2713 ':' \u2717 ')+S(s[3])));});
  box.appendChild(ul);box.appendChild(el('div',{'class':'k'},'trajectory ('+r.steps+' steps, '+r.tok+' tokens, '+r.lat.toFixed(2)+'s, run '+data.eval+':v'+r.v+':c'+c.i+':r'+r.r+')'));
  var ol=el('ol',{'class':'traj'});r.tr.forEach(function(t){var text=t[0]==='c'?('call '+S(t[1])+'('+S(t[3])+')'):
   (t[0]==='r'?('result of '+S(t[1])+': '+S(t[2])):('thought: '+S(t[2])));ol.appendChild(el('li',null,text));});
  box.appendChild(ol);side.appendChild(box);});
 td.appendChild(side);var tr=el('tr',{'class':'drill'});tr.appendChild(td);return tr;}
function renderRows(){var rows=data.cases.filter(visible).sort(function(a,b){var x=key(a),y=key(b);return (x<y?-1:x>y?1:0)*sortDir;});
 body.textContent='';rows.forEach(function(c){var st=status(c);var tr=el('tr',{'class':'case','data-case':c.id});
  tr.appendChild(el('td',null,c.id));tr.appendChild(el('td',null,c.input.length>90?c.input.slice(0,90)+'\u2026':c.input));
  V.forEach(function(_,v){var p=passes(c,v);tr.appendChild(el('td',{'class':p[0]===p[1]?'pass':'fail'},p[0]+'/'+p[1]));});
  tr.appendChild(el('td',{'class':st==='pass'?'pass':'fail'},st));
  tr.addEventListener('click',function(){open[c.id]=!open[c.id];render();});body.appendChild(tr);
  if(open[c.id]){body.appendChild(drill(c));}});
 count.textContent=rows.length+' of '+data.cases.length+' cases';}
var head=document.getElementById('case-head');
[['id','case'],['input','input']].concat(V.map(function(n,v){return ['v'+v,n];})).concat([['status','status']]).forEach(function(h){
 var th=el('th',{'class':h[0]==='input'?'':'sortable','data-key':h[0]},h[1]);
 if(h[0]!=='input'){th.addEventListener('click',function(){sortDir=sortKey===h[0]?-sortDir:1;sortKey=h[0];render();});}
 head.appendChild(th);});
// The filter, the selection and the open cases live in the URL's hash: a link shares the view.
function readHash(){var h=location.hash.replace(/^#/,'');h.split('&').forEach(function(part){
 var kv=part.split('=');if(kv.length!==2){return;}var k=kv[0],v=decodeURIComponent(kv[1]);
 if(k==='q'){search.value=v;}else if(k==='show'){which.value=v;}
 else if(k==='open'){v.split(',').forEach(function(id){if(id){open[id]=true;}});}
 else if(k==='sort'){var m=/^(-?)(.+)$/.exec(v);sortDir=m[1]?-1:1;sortKey=m[2];}});}
function writeHash(){var parts=[];if(search.value){parts.push('q='+encodeURIComponent(search.value));}
 if(which.value!=='all'){parts.push('show='+encodeURIComponent(which.value));}
 var ids=Object.keys(open).filter(function(id){return open[id];});
 if(ids.length){parts.push('open='+encodeURIComponent(ids.join(',')));}
 if(sortKey!=='i'){parts.push('sort='+(sortDir<0?'-':'')+sortKey);}
 if(history.replaceState){history.replaceState(null,'',parts.length?'#'+parts.join('&'):location.pathname);}}
function render(){renderRows();writeHash();}
search.addEventListener('input',function(){render();});which.addEventListener('change',function(){render();});
readHash();render();document.body.setAttribute('data-ready','1');
})();
